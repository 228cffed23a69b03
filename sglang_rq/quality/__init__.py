"""Quality evaluation of KV formats through the real SGLang engine (``sglang-rq eval``)."""
