"""Render a kustomization: `kubectl kustomize` when kubectl is installed, else a small resolver
for exactly the features deploy/ uses (resources, components, namespace, labels, images,
configMapGenerator with files and behavior create/replace, inline JSON 6902 `patches` with `add`
and `replace` on a kind/name target). The tests render with both when
they can and require identical output (up to the generated ConfigMap's hash suffix), so the
fallback cannot silently drift from kustomize.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
_HASH_SUFFIX = re.compile(r"^(prefix-router-config)-[a-z0-9]{10}$")


def kubectl() -> str | None:
    return shutil.which("kubectl")


def render_kubectl(path: Path) -> list[dict[str, Any]]:
    exe = kubectl()
    assert exe, "kubectl not installed"
    out = subprocess.run([exe, "kustomize", str(path)], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render(path: Path) -> list[dict[str, Any]]:
    return render_kubectl(path) if kubectl() else render_python(path)


def render_python(path: Path) -> list[dict[str, Any]]:
    return _build(Path(path))


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _kustomization(path: Path) -> dict[str, Any]:
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        if (path / name).exists():
            return yaml.safe_load((path / name).read_text()) or {}
    raise FileNotFoundError(f"no kustomization in {path}")


def _build(path: Path) -> list[dict[str, Any]]:
    k = _kustomization(path)
    objs: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        target = path / res
        objs += _build(target) if target.is_dir() else _load(target)
    for gen in k.get("configMapGenerator", []):
        data = {Path(f).name: (path / f).read_text() for f in gen.get("files", [])}
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]},
              "data": data}
        existing = [o for o in objs if o["kind"] == "ConfigMap"
                    and o["metadata"]["name"] == gen["name"]]
        if gen.get("behavior", "create") == "replace":
            assert existing, f"configMapGenerator {gen['name']}: nothing to replace"
            existing[0]["data"] = data
        else:
            objs.append(cm)
    for patch in k.get("patches", []):
        target = patch["target"]
        (obj,) = [o for o in objs if o["kind"] == target["kind"]
                  and o["metadata"]["name"] == target["name"]]
        for op in yaml.safe_load(patch["patch"]):
            _json_patch(obj, op)
    for comp in k.get("components", []):
        ck = _kustomization(path / comp)
        for res in ck.get("resources", []):
            objs += _load(path / comp / res)
    for spec in k.get("labels", []):
        for o in objs:
            o["metadata"].setdefault("labels", {}).update(spec["pairs"])
    for image in k.get("images", []):
        for o in objs:
            for c in _containers(o):
                if c["image"].split(":")[0] == image["name"]:
                    c["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    if "namespace" in k:
        ns = k["namespace"]
        for o in objs:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = ns
            for s in o.get("subjects", []) if o["kind"].endswith("RoleBinding") else []:
                if s["kind"] == "ServiceAccount":
                    s["namespace"] = ns
    return objs


def _json_patch(obj: dict[str, Any], op: dict[str, Any]) -> None:
    """One RFC 6902 `add` or `replace`; `-` appends to a list."""
    assert op["op"] in ("add", "replace"), f"unsupported patch op {op['op']!r}"
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        if last == "-":
            node.append(op["value"])
        elif op["op"] == "add":
            node.insert(int(last), op["value"])
        else:
            node[int(last)] = op["value"]
    else:
        node[last] = op["value"]


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", [])) + list(spec.get("initContainers", []))


def normalise(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strip the generated ConfigMap hash suffix (and its references) and sort: comparable."""
    text = yaml.safe_dump_all(copy.deepcopy(objs), sort_keys=True)
    text = re.sub(r"prefix-router-config-[a-z0-9]{10}", "prefix-router-config", text)
    out = [d for d in yaml.safe_load_all(text) if d]
    return sorted(out, key=lambda o: (o["kind"], o["metadata"]["name"]))


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name
                                                      or _HASH_SUFFIX.sub(r"\1",
                                                                          o["metadata"]["name"])
                                                      == name)]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]
