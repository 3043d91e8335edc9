# hetgmp-stream image: the `hetgmp` command with its dependencies.
#   docker build -t hetgmp-stream .                          # CPU build of torch (default)
#   docker build --build-arg TORCH=torch==2.5.1 ...          # another torch (e.g. a CUDA build)
#   docker build --build-arg PIP_EXTRA_INDEX_URL=... ...     # an index with CPU-only torch wheels keeps the image small
FROM python:3.11-slim

ARG TORCH=torch==2.13.0
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

WORKDIR /app
RUN pip install "${TORCH}"
COPY pyproject.toml README.md ./
COPY streaming ./streaming
COPY partitioner ./partitioner
COPY trainer ./trainer
COPY bench ./bench
RUN pip install ".[embedded]"

# Metrics ports: producer 9200, trainer ranks 9300 + rank.
EXPOSE 9200 9300 9301
ENTRYPOINT ["hetgmp"]
CMD ["--help"]
