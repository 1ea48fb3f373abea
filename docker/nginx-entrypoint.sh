#!/bin/sh
# Entrypoint of docker/nginx-debian.Dockerfile: the two start-up steps of the official nginx image
# (docker-entrypoint.d/15-local-resolvers.envsh and 20-envsubst-on-templates.sh) that
# docker-compose.scale.yml relies on, so either image runs docker/nginx.conf unchanged.
set -eu

# NGINX_LOCAL_RESOLVERS: this container's DNS server, for nginx's `resolver` directive (Docker's
# embedded DNS on 127.0.0.11, podman's aardvark-dns on the network's gateway). Unlike the official
# image this keeps only the first nameserver: podman lists the host's resolvers after its own, and
# those answer "not found" for service names (both embedded servers forward other names anyway).
if [ -n "${NGINX_ENTRYPOINT_LOCAL_RESOLVERS:-}" ]; then
    NGINX_LOCAL_RESOLVERS=$(awk '$1 == "nameserver" {
        if ($2 ~ ":") print "[" $2 "]"; else print $2; exit }' /etc/resolv.conf)
    export NGINX_LOCAL_RESOLVERS
fi

# /etc/nginx/templates/NAME.template -> /etc/nginx/conf.d/NAME, replacing only ${VAR}s that are
# set in the environment (nginx's own $variables stay as they are).
if [ -d /etc/nginx/templates ]; then
    defined=$(awk 'END { for (name in ENVIRON) printf "${%s} ", name }' < /dev/null)
    for template in /etc/nginx/templates/*.template; do
        [ -f "$template" ] || continue
        name=$(basename "$template" .template)
        envsubst "$defined" < "$template" > "/etc/nginx/conf.d/$name"
    done
fi

exec "$@"
