# kubeclip images, built with Docker from source (needs internet: the Go toolchain image and the
# Go module proxy). One target per image, all FROM scratch, static, non-root (65532):
#
#   docker build --target tenant-worker -t kubeclip/tenant-worker:dev .
#   docker build --target dispatcher    -t kubeclip/dispatcher:dev .
#   docker build --target run-watcher   -t kubeclip/run-watcher:dev .
#   docker build --target exec-worker   -t kubeclip/exec-worker:dev .
#   docker build --target credential-broker -t kubeclip/credential-broker:dev .
#   docker build --target kubeclip      -t kubeclip/kubeclip:dev .
#   docker build --target sandboxd      -t kubeclip/sandboxd:dev .   # copied into exec-capable pods
#   docker build --target nats          -t kubeclip/nats:dev .   # nats-server from go.mod's version
#
# Without internet, build the binaries locally and use Dockerfile.local, or hack/images/images.sh,
# which needs no Docker at all (README, Deploy).
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ \
      ./cmd/tenant-worker ./cmd/dispatcher ./cmd/run-watcher ./cmd/exec-worker ./cmd/credential-broker ./cmd/kubeclip ./cmd/sandboxd \
      github.com/nats-io/nats-server/v2 && \
    mkdir -p /out/data

FROM scratch AS base
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
USER 65532:65532

FROM base AS tenant-worker
COPY --from=build /out/tenant-worker /usr/local/bin/tenant-worker
ENTRYPOINT ["/usr/local/bin/tenant-worker"]

FROM base AS dispatcher
COPY --from=build /out/dispatcher /usr/local/bin/dispatcher
ENTRYPOINT ["/usr/local/bin/dispatcher"]

FROM base AS run-watcher
COPY --from=build /out/run-watcher /usr/local/bin/run-watcher
ENTRYPOINT ["/usr/local/bin/run-watcher"]

FROM base AS exec-worker
COPY --from=build /out/exec-worker /usr/local/bin/exec-worker
ENTRYPOINT ["/usr/local/bin/exec-worker"]

FROM base AS credential-broker
COPY --from=build /out/credential-broker /usr/local/bin/credential-broker
ENTRYPOINT ["/usr/local/bin/credential-broker"]

FROM base AS kubeclip
COPY --from=build /out/kubeclip /usr/local/bin/kubeclip
ENTRYPOINT ["/usr/local/bin/kubeclip"]

FROM base AS sandboxd
COPY --from=build /out/sandboxd /usr/local/bin/sandboxd
ENTRYPOINT ["/usr/local/bin/sandboxd"]

FROM base AS nats
COPY --from=build /out/nats-server /usr/local/bin/nats-server
# JetStream's store, writable by the non-root user (a named volume mounted here inherits it).
COPY --from=build --chown=65532:65532 /out/data /data
ENTRYPOINT ["/usr/local/bin/nats-server"]
