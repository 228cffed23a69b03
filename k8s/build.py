"""Build a kustomize overlay without the kustomize binary (none installs here from PyPI/npm/apt).

    python k8s/build.py k8s/overlays/gpu > gpu.yaml     # same output shape as `kustomize build`
    python k8s/build.py --sync-rules                     # regenerate base/prometheusrule.yaml

Supports the subset this repository uses, with kustomize's semantics: ``resources`` (files and
directories with a kustomization.yaml), ``namespace`` (also on RoleBinding ServiceAccount
subjects), ``labels[].pairs`` (metadata labels only, like ``includeSelectors: false``),
``images`` (newName/newTag) and ``patches[].path`` strategic-merge patches matched by kind and
name, where lists of objects with a ``name`` key (containers, env, volumes, volumeMounts, ports)
merge by name and every other list is replaced. Anything else in a kustomization is an error,
so the real ``kustomize build`` gives the same result (checked in tests when it is installed).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition"}


def strategic_merge(base: Any, patch: Any) -> Any:
    """Merge ``patch`` into ``base`` (dicts recursively, named-object lists by ``name``)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and patch
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = [copy.deepcopy(x) for x in base]
        index = {x["name"]: i for i, x in enumerate(out)}
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = strategic_merge(out[index[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def build(directory: str | Path) -> list[dict]:
    """The resources of the kustomization in ``directory``, transformed."""
    directory = Path(directory)
    kz = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kz) - SUPPORTED
    if unknown:
        raise ValueError(f"{directory}/kustomization.yaml: unsupported fields {sorted(unknown)}")
    docs: list[dict] = []
    for res in kz.get("resources", []):
        p = directory / res
        docs += build(p) if p.is_dir() else _load_docs(p)
    for patch_ref in kz.get("patches", []):
        for patch in _load_docs(directory / patch_ref["path"]):
            hits = [i for i, d in enumerate(docs) if d["kind"] == patch["kind"]
                    and d["metadata"]["name"] == patch["metadata"]["name"]]
            if len(hits) != 1:
                raise ValueError(f"patch {patch_ref['path']} matches {len(hits)} resources")
            docs[hits[0]] = strategic_merge(docs[hits[0]], patch)
    for entry in kz.get("labels", []):
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for img in kz.get("images", []):
        for d in docs:
            for c in _containers(d):
                ref = c["image"].split("@")[0]
                name = ref.rsplit(":", 1)[0] if ":" in ref.split("/")[-1] else ref
                if name == img["name"]:
                    c["image"] = f"{img.get('newName', name)}:{img['newTag']}" if "newTag" in img \
                        else img.get("newName", name)
    if "namespace" in kz:
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                d["metadata"]["namespace"] = kz["namespace"]
            for s in d.get("subjects", []) if d["kind"] == "RoleBinding" else []:
                if s.get("kind") == "ServiceAccount":
                    s["namespace"] = kz["namespace"]
    return docs


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def sync_rules() -> None:
    """Write base/prometheusrule.yaml from deploy/prometheus/rules/sglang-rq.rules.yml."""
    rules_file = ROOT.parent / "deploy/prometheus/rules/sglang-rq.rules.yml"
    rules = yaml.safe_load(rules_file.read_text())
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "sglang-rq", "labels": {"release": "prometheus"}}, "spec": rules}
    with open(ROOT / "base/prometheusrule.yaml", "w") as f:
        f.write("# GENERATED from deploy/prometheus/rules/sglang-rq.rules.yml "
                "(tests/test_deploy_static.py checks\n# they are equal): regenerate with "
                "`python k8s/build.py --sync-rules`.\n")
        yaml.safe_dump(doc, f, sort_keys=False, width=100)


def main(argv: list[str]) -> int:
    if argv == ["--sync-rules"]:
        sync_rules()
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    yaml.safe_dump_all(build(argv[0]), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
