#!/usr/bin/env bash
# Regenerates the Go code for api/. The generated files are committed; run this
# after editing a .proto file.
#   apt-get install -y protobuf-compiler
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
set -euo pipefail
cd "$(dirname "$0")"
PATH="$(go env GOPATH)/bin:$PATH"
mkdir -p .proto/aether
rm -rf .proto/aether/*
ln -s ../../registry .proto/aether/registry
ln -s ../../registrar .proto/aether/registrar
ln -s ../../edge .proto/aether/edge
ln -s ../../edgesync .proto/aether/edgesync
protoc -I .proto \
  --go_out=paths=source_relative:.proto \
  --go-grpc_out=paths=source_relative:.proto \
  aether/registry/v1/registry.proto aether/registrar/v1/registrar.proto \
  aether/edge/v1/edge.proto aether/edgesync/v1/edgesync.proto
rm -rf .proto
