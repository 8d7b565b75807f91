# syntax=docker/dockerfile:1
#
# The narad server image: `docker build -t narad .` (BuildKit; Docker 23+ uses it
# by default). The builder compiles `narad` with the official Rust image; the
# runtime stage is Debian slim with CA certificates, the binary and a non-root
# user (uid/gid 10001). Migrations are embedded in the binary.
#
#   docker run --rm -p 8080:8080 \
#     -e NARAD_DATABASE_URL=postgres://user:pass@host:5432/narad \
#     -e NARAD_JWT_HS256_SECRET=... narad            # = narad serve
#   docker run --rm -e NARAD_DATABASE_URL=... narad migrate
#
# The runtime stage is Debian slim rather than distroless so that the image has
# a shell and bash's /dev/tcp for docker-compose's health check of /healthz
# (and `sleep` for Kubernetes' preStop hook), without curl.

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# The whole workspace (.dockerignore leaves out target/, .git and local state):
# cargo needs every member's manifest, and the journal embeds migrations/.
COPY . .
# Cache mounts keep the crates.io index, downloaded crates and compiled
# dependencies between builds; the binary is copied out of the cached target
# directory because cache mounts are not part of the image.
RUN --mount=type=cache,id=narad-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=narad-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=narad-target,target=/src/target,sharing=locked \
    cargo build --release -p narad --locked \
    && install -D -m 0755 target/release/narad /out/narad

FROM ${RUNTIME_IMAGE} AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 narad \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/narad \
        --create-home --shell /usr/sbin/nologin narad
COPY --from=build /out/narad /usr/local/bin/narad

LABEL org.opencontainers.image.title="narad" \
      org.opencontainers.image.description="Multi-tenant HTTP server for the narad/v1 agent-session protocol" \
      org.opencontainers.image.licenses="Apache-2.0"

# In a container narad listens on every interface. NARAD_HOME (the embedded
# database and development secret) is only used without NARAD_DATABASE_URL,
# which containers should always set.
ENV NARAD_LISTEN=0.0.0.0:8080 \
    NARAD_HOME=/var/lib/narad

USER 10001:10001
WORKDIR /var/lib/narad
EXPOSE 8080
# narad drains streams and stops on SIGTERM (Docker's default stop signal).
STOPSIGNAL SIGTERM
ENTRYPOINT ["narad"]
CMD ["serve"]
