#!/bin/sh
# PID 1 of one lab node. Started by runbook.lab.netlab (nodes.start_node) as
#   ip netns exec nl-<name> unshare --uts --ipc --mount --pid --fork --kill-child --mount-proc nodeinit.sh
# so it already has its own network, UTS, IPC, mount and PID namespaces. It makes the node look like a
# Spark (hostname, /dev/shm, /mnt/nvme, /var/lib/docker, /usr/local/sbin, /etc/hosts are node-private; /usr, /etc
# and /var are overlays over the host's, so its packages are its own), then becomes the node's sshd. Every SSH
# session is a child of that sshd and so runs "as this node".
#
# Configuration comes from the environment (set by runbook/lab/netlab/nodes.py):
#   NL_HOSTNAME       e.g. spark-head
#   NL_NODE_DIR       <lab_dir>/nodes/<name>  (holds nvme/ docker/ sbin/ etc/ sshd_config)
#   NL_CGROUP_MOUNTS  lines "fstype mountpoint options" copied from the host's /proc/mounts
#   NL_PRIVATE        lines "<path under NL_NODE_DIR> <host path>" bound over the host's (users, groups, /home, ...)
#   NL_OVERLAYS       the trees given a node-private overlay ("/usr /etc /var")
#   NL_APT_CONF_FILE, NL_APT_CONF   the node's apt.conf.d file naming the lab's apt proxy, and its text
set -eu

: "${NL_HOSTNAME:?}" "${NL_NODE_DIR:?}"

say() { echo "nodeinit[$NL_HOSTNAME]: $*"; }

# Nothing mounted here may propagate back to the host.
mount --make-rprivate /

# Hostname (UTS namespace).
hostname "$NL_HOSTNAME"

# `ip netns exec` remounted /sys, which drops the cgroup mounts; dockerd/runc need them back.
mount -t tmpfs -o mode=755,nosuid,nodev,noexec cgroup_root /sys/fs/cgroup
printf '%s\n' "${NL_CGROUP_MOUNTS:-}" | while read -r fstype mnt opts; do
    [ -n "$fstype" ] || continue
    mkdir -p "$mnt"
    mount -t "$fstype" -o "$opts" "$fstype" "$mnt"
done

# Node-private /run (sshd privsep dir, docker.sock, dockerd.log, pid files).
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir -p /run/sshd /run/lock
chmod 0755 /run/sshd

# Node-private /dev/shm (with the IPC namespace): vLLM's in_the_same_node_as() probes for rank 0's
# shared-memory segment, so ranks on two "nodes" sharing the host's /dev/shm would take the
# same-machine path. Private, they are separate machines and use the cross-node (TCP) path, as on Sparks.
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm

# Node-private package state (NL_OVERLAYS, e.g. "/usr /etc /var"): an overlay over each, this machine's tree the
# lower layer, the node's writes in $NL_NODE_DIR/overlay/<dir>/{upper,work}. dpkg and apt in the node (a purge, an
# install, their triggers, lists, cache and logs) change only the node. Mounted before the bind mounts below, which
# land on top of them.
for dir in ${NL_OVERLAYS:-}; do
    layer="$NL_NODE_DIR/overlay/${dir#/}"
    mkdir -p "$layer/upper" "$layer/work"
    mount -t overlay spark-runbook-lab -o "lowerdir=$dir,upperdir=$layer/upper,workdir=$layer/work" "$dir" \
        || { say "cannot mount an overlay over $dir (upper $layer/upper)"; exit 1; }
done
# The node's apt reaches the Debian archive only through the lab host's apt proxy (NL_APT_CONF, written into the
# node's /etc overlay; this machine's apt configuration is untouched).
if [ -n "${NL_APT_CONF_FILE:-}" ]; then
    mkdir -p "$(dirname "$NL_APT_CONF_FILE")"
    printf '%s' "$NL_APT_CONF" > "$NL_APT_CONF_FILE"
fi

# Node-private directories and files (bind mounts live only in this mount namespace).
mount --bind "$NL_NODE_DIR/nvme" /mnt/nvme
mount --bind "$NL_NODE_DIR/docker" /var/lib/docker
mount --bind "$NL_NODE_DIR/sbin" /usr/local/sbin
mount --bind "$NL_NODE_DIR/etc/hostname" /etc/hostname
mount --bind "$NL_NODE_DIR/etc/hosts" /etc/hosts
# Node-private home: what a node writes under ~ (hub caches, `~/` weight paths, recipe checkouts) stays on
# that node, as on two Sparks. Only the host's Python installs under ~ (NL_HOME_SHARE, e.g. .pyenv: the
# lab venvs run on them) are bound back in, read-only.
mkdir -p /run/host-home
mount --bind /root /run/host-home
mount --bind "$NL_NODE_DIR/home" /root
for entry in $NL_HOME_SHARE; do
    mkdir -p "/root/$entry"
    mount --bind "/run/host-home/$entry" "/root/$entry"
    mount -o remount,bind,ro "/root/$entry"
done
umount -l /run/host-home
# Node-private users and groups (the lab's non-root operator exists only inside the nodes), its home under
# /home, its sudoers drop-in and the kernel NFS export files (NL_PRIVATE: "<path under NL_NODE_DIR> <target>"
# lines, from runbook/lab/netlab/spec.py NODE_PRIVATE; every target exists on the host).
printf '%s\n' "${NL_PRIVATE:-}" | while read -r src dst; do
    [ -n "$src" ] || continue
    mount --bind "$NL_NODE_DIR/$src" "$dst"
done
# node-to-node ssh over the fabric (lab key, pinned host keys) without touching the host's file
if [ -f "$NL_NODE_DIR/etc/ssh_config" ] && [ -f /etc/ssh/ssh_config ]; then
    mount --bind "$NL_NODE_DIR/etc/ssh_config" /etc/ssh/ssh_config
fi

say "namespaces ready; exec sshd"
exec /usr/sbin/sshd -D -f "$NL_NODE_DIR/sshd_config" -E "$NL_NODE_DIR/sshd.log"
