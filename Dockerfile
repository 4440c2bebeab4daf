# syntax=docker/dockerfile:1
# graceful-drain: one static-ish binary (glibc, rustls with ring; no OpenSSL) on distroless,
# the workspace's default member without features: the product only, no simulated cluster.
#   docker build -t graceful-drain:0.1.0 .
# The webhook runs as the image's non-root user; the node agent's DaemonSet overrides it
# with uid 0 (no capabilities) to create its sockets in the kubelet's root-owned folders.

FROM rust:1.95-bookworm AS builder
WORKDIR /src
# protoc comes from the protoc-bin-vendored crate (crates/graceful-drain-core/build.rs),
# so no system packages.
# The whole source tree (.dockerignore leaves out target/, charts, docs and local keys):
# the workspace's manifests name members, benches and tests that must exist to load.
COPY . .
# Cache mounts keep the registry and the target folder between builds; the binary is
# copied out of the cached target folder.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package graceful-drain --bin graceful-drain \
    && install -D -m 0755 target/release/graceful-drain /out/graceful-drain

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/graceful-drain /usr/local/bin/graceful-drain
USER 65532:65532
# Webhook HTTPS, webhook admin, node-agent admin.
EXPOSE 9443 9090 9091
ENTRYPOINT ["/usr/local/bin/graceful-drain"]
CMD ["--help"]
