# syntax=docker/dockerfile:1
# The aether binary (registrar, agent, edge and every client command) in a
# static, non-root, shell-less image.
#
#   docker build -t aether:dev --build-arg VERSION=v0.1.0 --build-arg COMMIT=$(git rev-parse HEAD) .
#
# deploy/dockerfile_test.go lints this file (stages, pins, user, static
# build flags, entrypoint) and runs its go build command; no image is built
# in CI (there is no container engine on the machines this is tested on).

# Build on the builder's own platform and cross-compile: a pure-Go static
# binary needs no emulation for another GOARCH. Pinned by tag (no digest
# for this tag could be verified here); pin a digest in a release pipeline.
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
ARG VERSION=dev
ARG COMMIT=unknown
WORKDIR /src
# Modules first: this layer is reused until go.mod/go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# CGO_ENABLED=0: no libc, so the binary runs on a base without one;
# -trimpath: no build-machine paths in the binary (reproducible);
# -buildvcs=false: .git is not in the context (.dockerignore), VERSION and
# COMMIT stamp the build instead.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
      -ldflags="-s -w -X github.com/aethermesh/aether/internal/cli.version=${VERSION} -X github.com/aethermesh/aether/internal/cli.commit=${COMMIT}" \
      -o /out/aether ./cmd/aether

# distroless static: CA certificates, tzdata and /etc/passwd with nonroot
# (65532), no shell, no package manager. Pinned by digest (the one public
# Dockerfiles pinned for :nonroot as of 2026-08; refresh with
# `crane digest gcr.io/distroless/static-debian12:nonroot`).
FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
COPY --from=build /out/aether /usr/local/bin/aether
# Numeric, so the kubelet can verify runAsNonRoot without a runAsUser.
USER 65532:65532
# Registrar gRPC, HTTP (/healthz, /readyz, /metrics), xDS.
EXPOSE 9443 8081 15010
ENTRYPOINT ["/usr/local/bin/aether"]
CMD ["--help"]
