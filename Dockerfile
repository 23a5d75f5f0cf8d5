# Multi-stage build: cgo is required (go-nvml loads libnvidia-ml.so.1 at run
# time through dlopen; the library comes from the host through the NVIDIA
# container toolkit, not from this image).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
    go build -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=${VERSION}" \
    -o /out/gpumem_exporter . \
 && mkdir -p /out/clients && cp -r clients/python/gpumem clients/python/autostart /out/clients/

# glibc runtime, no shell, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/gpumem_exporter /usr/local/bin/gpumem_exporter
# The Python client (zero-code mode: PYTHONPATH=/opt/gpumem/clients/autostart),
# for images built FROM this one; the DaemonSet does not publish it (the
# image has no shell to copy it with).
COPY --from=build /out/clients /opt/gpumem/clients
EXPOSE 9481
USER nonroot
ENTRYPOINT ["/usr/local/bin/gpumem_exporter"]
