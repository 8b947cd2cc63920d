# The container that `kgate run --container IMAGE` and the Action's `image:` input run the kernels in.
#   docker build -t kgate:v1 .
#   docker build --build-arg BASE_IMAGE=my-registry/pytorch:tag -t kgate:v1 .
# The default base has PyTorch built for CUDA 12.8, which covers Hopper (sm_90) and Blackwell
# (sm_100, sm_120), with Triton. Any image with Python >= 3.10, pip and torch works as BASE_IMAGE.
ARG BASE_IMAGE=pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

# Extra pip arguments, e.g. "--no-deps --no-build-isolation" for a base that already has every
# dependency and no network at build time (the tests build such an image).
ARG PIP_INSTALL_ARGS=""

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp/kgate-home

# bubblewrap confines each worker inside the container too, where the container's seccomp profile allows
# user namespaces (kgate --sandbox; without them the report says "sandbox: none (reason)"). A base without
# apt-get or without a network at build time goes without it.
RUN (command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq --no-install-recommends \
     bubblewrap && rm -rf /var/lib/apt/lists/*) || echo "bubblewrap not installed: workers run unsandboxed here"

COPY . /opt/kgate-src
RUN python -m pip install ${PIP_INSTALL_ARGS} /opt/kgate-src && rm -rf /opt/kgate-src && kgate --version

# Never root: the kernels are untrusted. kgate mounts the workspace read-only at /workspace and the
# output folder at /kgate-out, and gives the container no network.
USER 10001:10001
WORKDIR /workspace
ENTRYPOINT ["kgate"]
CMD ["--help"]
