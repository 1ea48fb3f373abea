# syntax=docker/dockerfile:1
# Load balancer image for docker-compose.scale.yml built from Debian's nginx package: a stand-in
# for nginx:1.28-alpine on hosts that cannot pull from Docker Hub (docker/ci-containers.sh builds
# it; docs/containers.md, "Run it without Docker"). Same behaviour where the compose file relies
# on it: conf.d templates with ${NGINX_LOCAL_RESOLVERS}, logs on stdout/stderr, busybox-like wget.
#
# NGINX_ROOTFS: a Debian root file system with nginx >= 1.27.3 (`server ... resolve` in
# docker/nginx.conf), wget and envsubst (gettext-base): Debian sid's nginx is recent enough,
# bookworm's (1.22) and trixie's (1.26) are not. docker/ci-containers.sh bootstraps it with
# mmdebstrap and `podman import`s it under this name.
ARG NGINX_ROOTFS=localhost/debian-nginx:sid
FROM ${NGINX_ROOTFS}
LABEL org.opencontainers.image.title="nginx (Debian) for disan-serve's scale-out"
# Debian's default site listens on :80; docker/nginx.conf is the only server here.
RUN rm -f /etc/nginx/sites-enabled/default \
    && mkdir -p /etc/nginx/templates \
    && ln -sf /dev/stdout /var/log/nginx/access.log \
    && ln -sf /dev/stderr /var/log/nginx/error.log \
    && nginx -v
COPY docker/nginx-entrypoint.sh /nginx-entrypoint.sh
EXPOSE 8080
# SIGQUIT: nginx finishes the requests in flight before exiting (SIGTERM drops them).
STOPSIGNAL SIGQUIT
ENTRYPOINT ["/nginx-entrypoint.sh"]
CMD ["nginx", "-g", "daemon off;"]
