# Multi-stage build: the same `cargo build --release --locked` CI runs, then a
# slim runtime image with a non-root user.
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# build settings for the bundled SQLite (see the file)
COPY .cargo ./.cargo
COPY src ./src
# the test kit: a workspace member, and `idemgate demo`'s consumer and client
COPY tests/testkit ./tests/testkit
COPY migrations ./migrations
# declared [[bench]] targets must exist for cargo to read the manifest
COPY benches ./benches
RUN cargo build --release --locked && strip target/release/idemgate

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data idemgate \
    && mkdir -p /data /etc/idemgate && chown idemgate /data
COPY --from=build /src/target/release/idemgate /usr/local/bin/idemgate
COPY config/docker.yaml /etc/idemgate/config.yaml
USER idemgate
WORKDIR /data
VOLUME ["/data"]
ENV IDEMGATE_CONFIG=/etc/idemgate/config.yaml
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:9090/healthz || exit 1
ENTRYPOINT ["idemgate"]
CMD ["serve"]
