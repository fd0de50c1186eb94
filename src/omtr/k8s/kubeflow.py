"""Compile the Kubeflow pipeline (``pipelines/omtr_pipeline.py``) and submit it to a Kubeflow endpoint.

Used by ``omtr pipeline compile`` and ``omtr pipeline submit``. The pipeline's source lives in the
repository beside its components (``components/``), not in the installed package: it is found in
the working directory's ``pipelines/`` or beside the package's source tree, or named explicitly.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger("omtr.kubeflow")

SOURCE = Path("pipelines") / "omtr_pipeline.py"
HEALTHZ = "/apis/v2beta1/healthz"


class KubeflowError(Exception):
    """One line that names the endpoint or file and says what to do."""


def find_source(source: str | None = None) -> Path:
    """The pipeline source: ``source``, else ./pipelines/omtr_pipeline.py, else the checkout's."""
    if source:
        p = Path(source)
        if not p.is_file():
            raise KubeflowError(f"pipeline source {source}: no such file")
        return p.resolve()
    here = Path(__file__).resolve()
    candidates = [Path.cwd() / SOURCE, here.parents[3] / SOURCE]  # src/omtr/k8s/ -> the checkout
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise KubeflowError(f"pipeline source {SOURCE} not found (looked in {', '.join(str(c.parent) for c in candidates)}): "
                        f"run from an omtr checkout or pass --source")


def load_pipeline(source: str | None = None):
    """The pipeline module (``omtr_pipeline`` function, ``compile_to``) loaded from its file."""
    path = find_source(source)
    spec = importlib.util.spec_from_file_location("omtr_kfp_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}$")
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*/[a-z0-9._-]+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def check_image(image: str, what: str = "--image") -> str:
    """``image`` if it is ``REGISTRY/REPO:TAG``, ``REGISTRY/REPO@sha256:DIGEST`` or both; else an error."""
    m = IMAGE_RE.match(image or "")
    if not m or not (m.group(1) or m.group(2)):
        raise KubeflowError(f"{what} {image!r}: expected REGISTRY/REPO/omtr:TAG or REGISTRY/REPO/omtr@sha256:DIGEST "
                            "(64 hex digits; `docker buildx imagetools inspect IMAGE` prints it)")
    return image


def compile_pipeline(out: str | Path, source: str | None = None, image: str | None = None,
                     trainer_image: str | None = None) -> Path:
    """Compile the pipeline to ``out`` (YAML) and return its path.

    ``image`` replaces the omtr image every step runs on, for clusters that pull from their own
    registry; the committed package names the project's default images. Give it by digest
    (``REGISTRY/REPO/omtr@sha256:...``, with or without a tag): kfp's cache key is computed from
    the component spec, image string included, so with a tag alone a re-pushed tag would let a
    cached step's result from older code stand in for the new code's. ``trainer_image`` replaces
    the train-job branch's default trainer image in the same way; without it, a tagged ``image``
    gives the trainer image of the same tag (``.../omtr-trainer-gpu:TAG``), and a digest-pinned
    one leaves the default, which then says so in the log."""
    out = Path(out)
    if out.parent and not out.parent.is_dir():
        raise KubeflowError(f"--out {out}: folder {out.parent} does not exist")
    if image:
        check_image(image)
    if trainer_image:
        check_image(trainer_image, "--trainer-image")
    module = load_pipeline(source)
    module.compile_to(str(out))
    if not (image or trainer_image):
        return out
    text = out.read_text(encoding="utf-8")
    if image:
        default = module.steps.OMTR_IMAGE
        if default not in text:
            raise KubeflowError(f"the compiled pipeline does not name the default image {default}; cannot replace it")
        if not DIGEST_RE.search(image):
            log.warning("%s is a tag: kfp caches steps by the image string, so a re-pushed tag can reuse results "
                        "of older code; give the image by digest (@sha256:...) to pin it", image)
        if trainer_image is None:
            base = DIGEST_RE.sub("", image)
            if DIGEST_RE.search(image) or "/omtr:" not in base:
                log.warning("trainer image left at %s: give --trainer-image (by digest) to replace it",
                            module.TRAINER_IMAGE)
            else:
                trainer_image = base.replace("/omtr:", "/omtr-trainer-gpu:")
        text = text.replace(default, image)
    if trainer_image:
        if module.TRAINER_IMAGE not in text:
            raise KubeflowError(f"the compiled pipeline does not name the trainer image {module.TRAINER_IMAGE}")
        text = text.replace(module.TRAINER_IMAGE, trainer_image)
    out.write_text(text, encoding="utf-8")
    return out


def pipeline_parameters(package: str | Path) -> dict[str, dict]:
    """{name: {"parameterType": ..., "defaultValue": ...}} of a compiled pipeline's run parameters."""
    import yaml

    try:
        docs = list(yaml.safe_load_all(Path(package).read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as exc:
        raise KubeflowError(f"pipeline package {package}: cannot read it ({exc})") from None
    spec = next((d for d in docs if isinstance(d, dict) and "root" in d), None)
    if spec is None:
        raise KubeflowError(f"pipeline package {package}: not a compiled Kubeflow pipeline (no root)")
    return dict(spec["root"].get("inputDefinitions", {}).get("parameters", {}))


def parse_params(pairs: list[str], declared: dict[str, dict]) -> dict:
    """``key=value`` strings typed by the pipeline's declared parameter types."""
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise KubeflowError(f"--param {pair!r}: write it as key=value")
        if key not in declared:
            raise KubeflowError(f"--param {key}: the pipeline has no such parameter; it has {', '.join(sorted(declared))}")
        kind = declared[key].get("parameterType", "STRING")
        try:
            if kind == "NUMBER_INTEGER":
                value = int(raw)
            elif kind == "NUMBER_DOUBLE":
                value = float(raw)
            elif kind == "BOOLEAN":
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                value = raw.lower() in ("true", "1", "yes")
            elif kind == "LIST":
                value = json.loads(raw) if raw.strip().startswith("[") else [v for v in raw.split(",") if v]
                if not isinstance(value, list):
                    raise ValueError(raw)
            elif kind == "STRUCT":
                value = json.loads(raw)
            else:
                value = raw
        except ValueError:
            what = {"NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number", "BOOLEAN": "true or false",
                    "LIST": "a JSON list or comma-separated values", "STRUCT": "a JSON object"}.get(kind, kind)
            raise KubeflowError(f"--param {key}={raw!r}: expected {what}") from None
        out[key] = value
    return out


def read_token(token_env: str | None, token_file: str | None) -> str | None:
    if token_env:
        token = os.environ.get(token_env, "").strip()
        if not token:
            raise KubeflowError(f"--token-env {token_env}: the variable is not set or empty; export the Kubeflow token in it")
        return token
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubeflowError(f"--token-file {token_file}: cannot read it ({exc.strerror})") from None
        if not token:
            raise KubeflowError(f"--token-file {token_file}: the file is empty")
        return token
    return None


def probe(host: str, token: str | None, timeout_s: float = 10.0) -> None:
    """GET the endpoint's healthz once, turning every way it can fail into one clear line
    (kfp.Client would retry for half a minute and then print a traceback)."""
    url = host.rstrip("/") + HEALTHZ
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            how = ("pass a valid one with --token-env or --token-file" if token else
                   "it needs a token: --token-env NAME or --token-file PATH")
            raise KubeflowError(f"Kubeflow at {host} refused the request (HTTP {exc.code}): {how}") from None
        if exc.code == 404:
            raise KubeflowError(f"Kubeflow at {host} has no {HEALTHZ} (HTTP 404): --host must be the Pipelines API "
                                f"endpoint, e.g. https://HOST/pipeline") from None
        raise KubeflowError(f"Kubeflow at {host} answered HTTP {exc.code} on {HEALTHZ}: check the endpoint's logs") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KubeflowError(f"Kubeflow at {host} cannot be reached ({reason}): check --host, or port-forward the "
                            f"API (kubectl -n kubeflow port-forward svc/ml-pipeline-ui 8080:80; --host http://127.0.0.1:8080)") from None


def submit(host: str, package: str | Path, *, token: str | None, params: dict, experiment: str,
           run_name: str | None = None, namespace: str | None = None, service_account: str | None = None,
           wait: bool = False, timeout_s: float = 24 * 3600) -> dict:
    """Create a run of ``package`` at ``host``; with ``wait``, wait for it to finish."""
    import warnings

    probe(host, token)
    import kfp
    from kfp_server_api.exceptions import ApiException

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            client = kfp.Client(host=host, existing_token=token, **({"namespace": namespace} if namespace else {}))
        res = client.create_run_from_pipeline_package(
            str(package), arguments=params, run_name=run_name, experiment_name=experiment,
            namespace=namespace, service_account=service_account)
    except ApiException as exc:
        raise KubeflowError(f"Kubeflow at {host} refused the run (HTTP {exc.status} {exc.reason}): "
                            f"{(exc.body or '')[:300]}") from None
    out = {"run_id": res.run_id, "host": host, "experiment": experiment,
           "url": f"{host.rstrip('/')}/#/runs/details/{res.run_id}"}
    if wait:
        try:
            run = client.wait_for_run_completion(res.run_id, timeout=timeout_s)
        except TimeoutError:
            raise KubeflowError(f"run {res.run_id} at {host} did not finish within {timeout_s:g} s; it goes on: "
                                f"follow it at {out['url']}") from None
        out["state"] = str(run.state)
    return out
