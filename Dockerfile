# syntax=docker/dockerfile:1
# The Go version must follow go.mod's go line (.ci/compose-check checks it).
FROM golang:1.26.8 AS build
WORKDIR /src
COPY . .
# No "go mod download": it would fetch every module in go.mod, the test-only
# ones too (dockertest, goleak). go build fetches only what the service needs.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/transferconsumer .

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/transferconsumer /transferconsumer
USER nonroot
# /healthz, /readyz, /metrics (HTTP_ADDR, default :8080)
EXPOSE 8080
ENTRYPOINT ["/transferconsumer"]
