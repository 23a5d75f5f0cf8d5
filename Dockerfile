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
 && CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
    go build -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=${VERSION}" \
    -o /out/gpumem-csi ./cmd/gpumem-csi \
 && mkdir -p /out/clients && cp -r clients/python/gpumem clients/python/autostart /out/clients/

# glibc runtime, no shell, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/gpumem_exporter /usr/local/bin/gpumem_exporter
# The CSI node plugin (docs/csi.md): the DaemonSet runs it as a second,
# privileged container of this image (command /usr/local/bin/gpumem-csi);
# at startup it copies the client below into the directory it publishes.
COPY --from=build /out/gpumem-csi /usr/local/bin/gpumem-csi
# The Python client (zero-code mode: PYTHONPATH=/opt/gpumem/clients/autostart),
# for images built FROM this one; gpumem-csi publishes it to pods as
# /run/gpumem/python/{gpumem,autostart}.
COPY --from=build /out/clients /opt/gpumem/clients
EXPOSE 9481
USER nonroot
ENTRYPOINT ["/usr/local/bin/gpumem_exporter"]
