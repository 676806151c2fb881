"""Render a kustomization: with a kustomize binary when one is installed, else in Python.

The Python renderer covers exactly the kustomize features deploy/k8s uses — resources
(files and directories), components, namespace, labels, images and configMapGenerator
(with its options labels, annotations and disableNameSuffixHash) — and refuses anything
else, so it can never silently build something different. Generated ConfigMaps keep their
plain names here (kustomize appends a content hash unless told not to, and rewrites the
references; the tests look names up through the references either way).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "components",
    "labels",
    "images",
    "configMapGenerator",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


def kustomize_command() -> list[str] | None:
    """`kustomize build` or `kubectl kustomize` (kubectl bundles kustomize), if installed."""
    if exe := shutil.which("kustomize"):
        return [exe, "build"]
    if exe := shutil.which("kubectl"):
        return [exe, "kustomize"]
    return None


def build_with_binary(directory: Path) -> list[dict[str, Any]]:
    cmd = kustomize_command()
    assert cmd is not None
    proc = subprocess.run([*cmd, str(directory)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(cmd)} {directory} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_NAMES:
        if (directory / name).is_file():
            return directory / name
    raise AssertionError(f"{directory} has no kustomization file")


def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), f"{path} is not a mapping"
    return data


def _docs(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for d in docs:
        assert isinstance(d, dict) and "apiVersion" in d and "kind" in d, f"{path}: not a manifest"
    return docs


def _generator_files(gen: dict[str, Any], root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for entry in gen.get("files", []):
        key, _, rel = entry.partition("=")
        if not rel:
            key, rel = Path(entry).name, entry
        path = (root / rel).resolve()
        assert path.is_file(), f"{root}: configMapGenerator file {rel} does not exist"
        assert root.resolve() in path.parents, f"{root}: {rel} is outside the kustomization root"
        out[key] = path
    return out


def referenced_files(directory: Path) -> set[Path]:
    """Every file a kustomization tree reads (kustomizations, resources, generator inputs)."""
    seen: set[Path] = set()

    def walk(d: Path) -> None:
        kfile = kustomization_file(d)
        seen.add(kfile.resolve())
        k = _load(kfile)
        for ref in [*k.get("resources", []), *k.get("components", [])]:
            target = (d / ref).resolve()
            if target.is_dir():
                walk(target)
            else:
                assert target.is_file(), f"{kfile}: {ref} does not exist"
                seen.add(target)
        for gen in k.get("configMapGenerator", []):
            seen.update(_generator_files(gen, d).values())

    walk(directory)
    return seen


def build_in_python(directory: Path, *, component: bool = False) -> list[dict[str, Any]]:
    kfile = kustomization_file(directory)
    k = _load(kfile)
    unsupported = set(k) - SUPPORTED_KEYS
    assert not unsupported, f"{kfile}: the Python renderer does not support {sorted(unsupported)}"
    want_kind = "Component" if component else "Kustomization"
    assert k.get("kind", "Kustomization") == want_kind, f"{kfile}: expected kind {want_kind}"

    docs: list[dict[str, Any]] = []
    for ref in k.get("resources", []):
        target = directory / ref
        if target.is_dir():
            docs += build_in_python(target)
        else:
            assert target.is_file(), f"{kfile}: resource {ref} does not exist"
            docs += copy.deepcopy(_docs(target))
    for gen in k.get("configMapGenerator", []):
        unknown = set(gen) - {"name", "files", "literals", "options"}
        options = gen.get("options", {})
        unknown |= set(options) - {"labels", "annotations", "disableNameSuffixHash"}
        assert not unknown, f"{kfile}: the Python renderer does not support {sorted(unknown)}"
        data = {key: p.read_text(encoding="utf-8") for key, p in _generator_files(gen, directory).items()}
        for literal in gen.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        meta: dict[str, Any] = {"name": gen["name"]}
        for field in ("labels", "annotations"):
            if options.get(field):
                meta[field] = dict(options[field])
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for ref in k.get("components", []):
        docs += build_in_python(directory / ref, component=True)

    for spec in k.get("labels", []):
        assert not spec.get("includeSelectors"), "selector labels are not supported by the Python renderer"
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(spec["pairs"])
            template = d.get("spec", {}).get("template")
            if isinstance(template, dict) and spec.get("includeTemplates"):
                template.setdefault("metadata", {}).setdefault("labels", {}).update(spec["pairs"])
    for image in k.get("images", []):
        for d in docs:
            pod = d.get("spec", {}).get("template", {}).get("spec", {})
            for c in [*pod.get("containers", []), *pod.get("initContainers", [])]:
                name, _, tag = str(c.get("image", "")).partition(":")
                if name == image["name"]:
                    new_name = image.get("newName", name)
                    new_tag = image.get("newTag", tag)
                    c["image"] = f"{new_name}:{new_tag}" if new_tag else new_name
    if ns := k.get("namespace"):
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                d["metadata"]["namespace"] = ns
    return docs


def render(directory: Path) -> list[dict[str, Any]]:
    """The manifests a directory builds to: the real kustomize if available, else Python."""
    if kustomize_command() is not None:
        return build_with_binary(directory)
    return build_in_python(directory)
