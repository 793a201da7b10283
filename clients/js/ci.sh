#!/bin/sh
# Install, build and test the TypeScript client (clients/js). Exits non-zero on any failure.
# Real-node tests run when LOCKSERVICE_TWISTD names a twistd with the lockservice plugin.
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
npm run build
npm test
