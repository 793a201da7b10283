#!/usr/bin/env bash
# CI for the Go client: gofmt, vet, build, the driver, the tests (with the
# race detector). Needs `go` on PATH; real-node tests run when
# LOCKSERVICE_TWISTD names a twistd with the lockservice plugin.
set -euo pipefail
cd "$(dirname "$0")"
export GOFLAGS="${GOFLAGS:--mod=mod}" GOPROXY="${GOPROXY:-off}" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

gofmt_bin="$(go env GOROOT)/bin/gofmt"
if [ ! -x "$gofmt_bin" ]; then
    gofmt_bin="$(command -v gofmt)"
fi
unformatted="$("$gofmt_bin" -l .)"
if [ -n "$unformatted" ]; then
    echo "gofmt: these files need formatting:" >&2
    echo "$unformatted" >&2
    exit 1
fi
go vet ./...
go build ./...
mkdir -p bin
go build -o bin/lockservice-driver ./cmd/lockservice-driver
go test -race -count=1 -p 1 -timeout 300s ./...
echo "clients/go: ci ok"
