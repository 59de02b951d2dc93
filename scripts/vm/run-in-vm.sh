#!/bin/bash
# scripts/vm/run-in-vm.sh -- rdma-hint's Soft-RoCE harness (adapted from the workplace's
# reference script; this copy is ours to maintain). Used by scripts/vm/verbs-tests.sh (CI) and
# benches/verbs-vs-perftest.sh.
#
# Runs a command inside a throw-away qemu VM that boots Debian's
# stock kernel (package linux-image-amd64, which has rdma_rxe.ko = Soft-RoCE),
# with a real ibverbs device "rxe0" ready. It installs only missing packages and
# never removes or downgrades one; the kernel is this machine's own when it has
# rdma_rxe, else the package unpacked into the cache (not installed into /boot); qemu is
# unpacked the same way where apt cannot install it without removing a package the machine has.
#
#   usage: run-in-vm.sh CMD [ARG...]     (one argument = shell code for bash -c)
#   e.g.   run-in-vm.sh ibv_devinfo -d rxe0
#          run-in-vm.sh 'ib_write_bw -d rxe0 & sleep 1; ib_write_bw -d rxe0 $RXE_IP'
#
# The guest's root is the HOST's / shared read-only over virtio-9p, so binaries
# built on the host run unchanged. Writable in the guest: /tmp /run /var/tmp
# /dev/shm (fresh tmpfs) and RXE_VM_RWDIR (default: the current directory,
# shared read-write at the same path). The command runs as root in the current
# directory with stdin=/dev/null; its stdout+stderr are streamed to this
# script's stdout; the script exits with the command's exit code
# (124 = timeout, 125 = the VM failed before the command reported back).
#
# Inside the VM, before CMD runs: modules rdma_rxe + ib_uverbs loaded; a veth
# pair rxenet0 (10.77.0.1/24) <-> rxenet1 (10.77.0.2/24), which exists only
# inside the VM (qemu gets no network card at all, so nothing leaves the VM);
# rxe0 on rxenet0. Exported: RXE_DEV=rxe0 RXE_NETDEV=rxenet0 RXE_IP=10.77.0.1
# RXE_PEER_IP=10.77.0.2 RXE_VM=1, and UCX_UD_VERBS_ETH_DGID_CHECK=n (without
# it UCX's ud_verbs/rc_verbs time out on rxe).
#
# Two-VM mode (a real 2-node RoCE link): start "RXE_VM_NODE=a run-in-vm.sh ..."
# and "RXE_VM_NODE=b run-in-vm.sh ..." at the same time; each VM gets a
# virtio-net eth0 (10.77.1.1 for a, 10.77.1.2 for b) whose frames travel as
# UDP datagrams between 127.0.0.1:P and 127.0.0.1:P+1 on the host
# (P = RXE_VM_LINK_PORT, default 47910); rxe0 sits on eth0, RXE_NODE=a|b is set.
#
# Environment knobs:
#   RXE_VM_TIMEOUT  seconds for the whole VM run (default 900)
#   RXE_VM_CPUS     vCPUs (default 2)          RXE_VM_MEM  memory (default 1024M)
#   RXE_VM_ACCEL    auto|kvm|tcg (default auto: kvm only with kvm_intel/kvm_amd)
#   RXE_VM_KERNEL   kernel image (default: newest /boot/vmlinuz-* whose
#                   /lib/modules/<ver> has rdma_rxe.ko, else Debian's linux-image package
#                   unpacked under $RXE_VM_CACHE/kernel-root, never installed)
#   RXE_VM_KERNEL_FROM=package  use the unpacked package even if /boot has a kernel
#   RXE_VM_RWDIR    host dir shared read-write ("" = none; default $PWD)
#   RXE_VM_CACHE    where vmlinux/initramfs (and an unpacked kernel and qemu) are cached
#                   (default /var/cache/rxe-vm; not under /tmp, which the guest cannot see)
#   RXE_VM_NO_INSTALL=1  never run apt-get (default: install what is missing)
#   RXE_VM_MTU      MTU of the netdev under rxe0 (default 9000 -> active_mtu 4096;
#                   1500 -> active_mtu 1024)
#   RXE_VM_SETUP    extra shell code run in the guest before CMD
#   RXE_VM_VERBOSE=1     always print the guest kernel log afterwards
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,/^set -euo/p' "$0" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run-in-vm.sh: must run as root" >&2; exit 2; }

TIMEOUT=${RXE_VM_TIMEOUT:-900}
CPUS=${RXE_VM_CPUS:-2}
MEM=${RXE_VM_MEM:-1024M}
ACCEL=${RXE_VM_ACCEL:-auto}
CACHE=${RXE_VM_CACHE:-/var/cache/rxe-vm}
RWDIR=${RXE_VM_RWDIR-$PWD}
log() { echo "run-in-vm: $*" >&2; }
SCRIPTS=$(cd "$(dirname "$0")/.." && pwd)

# ---- 1. packages (Debian 12): only what is missing, never removing or downgrading --------
# qemu comes from apt when apt can install it as the machine is. Where it cannot (an image with a
# newer qemu-utils from a suite its apt sources lack: installing Debian's qemu-system-x86 would
# remove it), its libraries are installed and the qemu packages themselves are downloaded and
# unpacked under $CACHE/qemu-root, as the kernel is: nothing the machine has is removed or changed.
QEMU_PKGS_RE='^(qemu-.*|seabios|ipxe-qemu)$'
QROOT=$CACHE/qemu-root
apt_updated=0
apt_update() { [ "$apt_updated" = 1 ] || { apt-get update -qq >&2; apt_updated=1; }; }
# Packages the machine has that apt would remove, upgrade or downgrade to install "$@"
# (scripts/apt-changes.sh): empty when it can install them as the machine is. An upgrade counts:
# rdma-core, say, pulls a udev that upgrades the machine's systemd. When apt cannot even plan
# the install (its errors printed), the answer is "apt cannot install it as is".
apt_changes() {
    "$SCRIPTS/apt-changes.sh" "$@" || echo "apt's plan (its errors are above)"
}
apt_install() { # packages...
    export DEBIAN_FRONTEND=noninteractive
    apt_update
    local changes
    changes=$(apt_changes "$@")
    if [ -n "$changes" ]; then
        log "installing $* would remove or change $changes; install them yourself without that (or set RXE_VM_NO_INSTALL=1)"
        exit 2
    fi
    log "installing $*"
    apt-get install -y -qq --no-install-recommends --no-remove "$@" >&2
}
qemu_unpacked() {
    local D changes libs qemu_debs
    mkdir -p "$CACHE"
    exec 7>"$CACHE/.qemu-lock"; flock 7
    if [ ! -x "$QROOT/usr/bin/qemu-system-x86_64" ]; then
        apt_update
        changes=$(apt_changes qemu-system-x86)
        # What apt would install for qemu-system-x86: the qemu packages are unpacked, the rest
        # (shared libraries nothing installed conflicts with) installed.
        # Every package apt would bring for qemu-system-x86 (new ones, and the ones it would
        # change, which are unpacked or refused below rather than installed).
        mapfile -t wanted < <(apt-get install -s --no-install-recommends qemu-system-x86 2>/dev/null |
            awk '$1 == "Inst" { print $2 }')
        qemu_debs=(); libs=()
        for package in "${wanted[@]}"; do
            if [[ $package =~ $QEMU_PKGS_RE ]]; then qemu_debs+=("$package"); else libs+=("$package"); fi
        done
        ((${#qemu_debs[@]})) || { log "apt offers no qemu-system-x86 to unpack"; exit 2; }
        log "apt cannot install qemu-system-x86 as this machine is (it would remove or change ${changes:-nothing}): unpacking ${qemu_debs[*]} into $QROOT (not installed)"
        ((${#libs[@]} == 0)) || apt_install "${libs[@]}"
        D=$(mktemp -d)
        (cd "$D" && apt-get download -qq "${qemu_debs[@]}" >&2)
        rm -rf "$QROOT.tmp"; mkdir -p "$QROOT.tmp"
        for deb in "$D"/*.deb; do dpkg-deb -x "$deb" "$QROOT.tmp"; done
        rm -rf "$D"
        # The firmware links are absolute (/usr/share/qemu/bios-256k.bin -> /usr/share/seabios/...):
        # point them into the unpacked root.
        find "$QROOT.tmp" -type l | while read -r link; do
            target=$(readlink "$link")
            case "$target" in /*) ln -sfn "$QROOT$target" "$link" ;; esac
        done
        rm -rf "$QROOT"; mv "$QROOT.tmp" "$QROOT"
    fi
    flock -u 7
}
QEMU=qemu-system-x86_64
QEMU_FIRMWARE=()
if ! command -v qemu-system-x86_64 >/dev/null && [ -x "$QROOT/usr/bin/qemu-system-x86_64" ]; then QEMU=unpacked; fi
need_pkgs=()
[ "$QEMU" = unpacked ] || command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list | grep -x insmod >/dev/null || need_pkgs+=(busybox-static)
command -v cpio  >/dev/null || need_pkgs+=(cpio)
command -v xz    >/dev/null || need_pkgs+=(xz-utils)
command -v modprobe >/dev/null || need_pkgs+=(kmod)
command -v rdma  >/dev/null || need_pkgs+=(iproute2)
command -v ibv_devinfo >/dev/null || need_pkgs+=(ibverbs-utils)
# The rxe provider only: rdma-core (udev rules, services) is not needed to use rxe0 in the VM.
[ -e /etc/libibverbs.d/rxe.driver ] || need_pkgs+=(ibverbs-providers)
command -v ib_write_bw >/dev/null || need_pkgs+=(perftest)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    [ "${RXE_VM_NO_INSTALL:-0}" = 1 ] && { log "missing packages: ${need_pkgs[*]} (RXE_VM_NO_INSTALL=1: not installing)"; exit 2; }
    apt_update
    if [[ " ${need_pkgs[*]} " == *" qemu-system-x86 "* ]] && [ -n "$(apt_changes qemu-system-x86)" ]; then
        mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | grep -vx qemu-system-x86)
        qemu_unpacked
        QEMU=unpacked
    fi
    ((${#need_pkgs[@]} == 0)) || apt_install "${need_pkgs[@]}"
fi
if [ "$QEMU" = unpacked ]; then
    QEMU=$QROOT/usr/bin/qemu-system-x86_64
    export QEMU_MODULE_DIR=$QROOT/usr/lib/x86_64-linux-gnu/qemu
    QEMU_FIRMWARE=(-L "$QROOT/usr/share/qemu" -L "$QROOT/usr/share/seabios" -L "$QROOT/usr/lib/ipxe/qemu")
fi

# ---- 2. kernel: this machine's own (a /boot/vmlinuz-* whose modules have rdma_rxe), else
#         Debian's kernel package unpacked into the cache (nothing goes into /boot or
#         /lib/modules); KROOT is the root its /boot and /lib/modules live under ----------
newest_rxe_kernel() { # ROOT ("" = /) -> newest version with rdma_rxe and a vmlinuz
    { ls "$1"/lib/modules/*/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* 2>/dev/null || true; } |
        sed "s|^$1/lib/modules/||; s|/.*||" |
        while read -r v; do [ -f "$1/boot/vmlinuz-$v" ] && echo "$v"; done | sort -V | tail -n1
}
KROOT=""
if [ -n "${RXE_VM_KERNEL:-}" ]; then
    VMLINUZ=$RXE_VM_KERNEL
    KVER=$(basename "$VMLINUZ"); KVER=${KVER#vmlinuz-}
else
    KVER=""
    [ "${RXE_VM_KERNEL_FROM:-}" = package ] || KVER=$(newest_rxe_kernel "")
    if [ -z "$KVER" ]; then
        KROOT=$CACHE/kernel-root
        mkdir -p "$CACHE"
        exec 8>"$CACHE/.kernel-lock"; flock 8
        KVER=$(newest_rxe_kernel "$KROOT")
        if [ -z "$KVER" ]; then
            [ "${RXE_VM_NO_INSTALL:-0}" = 1 ] && { log "no kernel with rdma_rxe here or in $KROOT"; exit 2; }
            [ "$apt_updated" = 1 ] || { apt-get update -qq >&2; apt_updated=1; }
            image=$(apt-cache depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
            [ -n "$image" ] || { log "no linux-image package for linux-image-amd64"; exit 2; }
            log "unpacking $image into $KROOT (not installed: /boot and /lib/modules stay as they are)"
            D=$(mktemp -d)
            (cd "$D" && apt-get download -qq "$image" >&2 2>/dev/null) || (cd "$D" && apt-get download "$image" >&2)
            rm -rf "$KROOT.tmp"; mkdir -p "$KROOT.tmp"
            dpkg-deb -x "$D"/*.deb "$KROOT.tmp"
            rm -rf "$D"
            # Debian 12 is merged-/usr: the package may ship /usr/lib/modules.
            [ -d "$KROOT.tmp/lib/modules" ] || { mkdir -p "$KROOT.tmp/lib"; ln -s ../usr/lib/modules "$KROOT.tmp/lib/modules"; }
            v=$(ls "$KROOT.tmp/lib/modules" | head -n1)
            depmod -b "$KROOT.tmp" "$v"
            rm -rf "$KROOT"; mv "$KROOT.tmp" "$KROOT"
            KVER=$(newest_rxe_kernel "$KROOT")
        fi
        flock -u 8
        [ -n "$KVER" ] || { log "no kernel with rdma_rxe.ko under $KROOT"; exit 2; }
    fi
    VMLINUZ=$KROOT/boot/vmlinuz-$KVER
fi
[ -d "$KROOT/lib/modules/$KVER" ] || { log "no $KROOT/lib/modules/$KVER"; exit 2; }
MODPROBE=(modprobe); [ -z "$KROOT" ] || MODPROBE=(modprobe -d "$KROOT")

# ---- 3. cached boot artefacts: uncompressed vmlinux (PVH boot skips the slow
#         in-guest decompression) and a small busybox initramfs ------------------
C=$CACHE/$KVER
mkdir -p "$C"
exec 9>"$C/.lock"; flock 9
# a kernel package update (same ABI name) invalidates the cache
if [ -e "$C/vmlinux" ] && [ "$VMLINUZ" -nt "$C/vmlinux" ]; then rm -f "$C/vmlinux" "$C/initrd.gz"; fi
if [ ! -s "$C/vmlinux" ]; then
    off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$VMLINUZ" | head -n1 | cut -d: -f1 || true)
    if [ -n "$off" ] && xz -dc --single-stream < <(tail -c +$((off + 1)) "$VMLINUZ" 2>/dev/null) > "$C/vmlinux.tmp" 2>/dev/null &&
       head -c4 "$C/vmlinux.tmp" | grep -q ELF; then
        mv "$C/vmlinux.tmp" "$C/vmlinux"
    else
        rm -f "$C/vmlinux.tmp"; ln -sf "$VMLINUZ" "$C/vmlinux"
    fi
fi
if [ ! -s "$C/initrd.gz" ] || [ "$0" -nt "$C/initrd.gz" ]; then
    T=$(mktemp -d)
    mkdir -p "$T"/{bin,dev,proc,sys,newroot,lib/modules}
    cp /bin/busybox "$T/bin/busybox"
    for m in virtio_pci 9pnet_virtio 9p virtio_console; do
        "${MODPROBE[@]}" -S "$KVER" --show-depends "$m"
    done | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++' > "$T/mods.list"
    while read -r ko; do cp "$ko" "$T/lib/modules/"; basename "$ko" >> "$T/mods.order"; done < "$T/mods.list"
    rm "$T/mods.list"
    cat > "$T/init" <<'EOF'
#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc; $B mount -t sysfs sysfs /sys; $B mount -t devtmpfs dev /dev
for m in $($B cat /mods.order); do $B insmod /lib/modules/$m || echo "insmod $m failed"; done
arg() { $B sed -n "s/.*$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
N=/newroot
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot $N || { echo "9p root mount failed"; $B poweroff -f; }
$B mount -t proc proc $N/proc; $B mount -t sysfs sysfs $N/sys; $B mount -t devtmpfs dev $N/dev
$B mkdir -p $N/dev/pts $N/dev/shm; $B mount -t devpts devpts $N/dev/pts; $B mount -t tmpfs shm $N/dev/shm
for d in run tmp var/tmp; do $B mount -t tmpfs -o mode=1777 tmpfs $N/$d; done
$B mkdir -p $N/run/rxe-job
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job $N/run/rxe-job || echo "job mount failed"
RW=$(arg rxevm.rwdir)
if [ -n "$RW" ]; then $B mkdir -p $N$RW; $B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rwdir $N$RW || echo "rwdir mount failed"; fi
# switch_root from PID 1 (not a child chroot) so that kernel usermode helpers
# (module autoload: /sbin/modprobe) see the host root as well.
exec $B switch_root $N /bin/busybox sh -c \
  'O=/dev/hvc0; [ -c $O ] || O=/dev/console; /bin/bash /run/rxe-job/guest.sh </dev/null >$O 2>&1; /bin/busybox sync; /bin/busybox poweroff -f'
EOF
    chmod +x "$T/init"
    (cd "$T" && find . | cpio -o -H newc --quiet | gzip -1) > "$C/initrd.gz.tmp"
    mv "$C/initrd.gz.tmp" "$C/initrd.gz"
    rm -rf "$T"
fi
flock -u 9

# ---- 4. job directory: guest-side script --------------------------------------
JOB=$(mktemp -d /tmp/rxe-vm-job.XXXXXX)
cleanup() { rm -rf "$JOB"; }
trap cleanup EXIT
if [ $# -eq 1 ]; then USERCMD="bash -c $(printf '%q' "$1")"; else USERCMD=$(printf '%q ' "$@"); fi
MTU=${RXE_VM_MTU:-9000}
NODE=${RXE_VM_NODE:-}
case "$NODE" in
  "")  NET="modprobe veth &&
  ip link add rxenet0 type veth peer name rxenet1 &&
  ip addr add 10.77.0.1/24 dev rxenet0 && ip addr add 10.77.0.2/24 dev rxenet1 &&
  ip link set rxenet0 mtu $MTU up && ip link set rxenet1 mtu $MTU up"
       VARS="RXE_NETDEV=rxenet0 RXE_IP=10.77.0.1 RXE_PEER_IP=10.77.0.2" ;;
  a|b) NET="modprobe virtio_net &&
  for i in \$(seq 50); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done &&
  ip addr add 10.77.1.$([ "$NODE" = a ] && echo 1 || echo 2)/24 dev eth0 && ip link set eth0 mtu $MTU up"
       VARS="RXE_NETDEV=eth0 RXE_NODE=$NODE RXE_IP=10.77.1.$([ "$NODE" = a ] && echo 1 || echo 2) RXE_PEER_IP=10.77.1.$([ "$NODE" = a ] && echo 2 || echo 1)" ;;
  *) log "RXE_VM_NODE must be a or b"; exit 2 ;;
esac
cat > "$JOB/guest.sh" <<EOF
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
export RXE_VM=1 RXE_DEV=rxe0 $VARS
# UCX (1.13) drops UD packets from rxe unless this check is off (RoCEv2/IPv4 GRH)
export UCX_UD_VERBS_ETH_DGID_CHECK=\${UCX_UD_VERBS_ETH_DGID_CHECK:-n}
echo 125 > /run/rxe-job/rc
KROOT=$(printf '%q' "$KROOT")
if [ -n "\$KROOT" ]; then
  # The kernel's modules live under KROOT, not /lib/modules: modprobe (ours and the kernel's
  # autoloads) looks there.
  mkdir -p /run/rxe-bin
  printf '#!/bin/sh\nexec /sbin/modprobe -d %s "\$@"\n' "\$KROOT" > /run/rxe-bin/modprobe
  chmod +x /run/rxe-bin/modprobe
  echo /run/rxe-bin/modprobe > /proc/sys/kernel/modprobe
  export PATH=/run/rxe-bin:\$PATH
fi
setup_ok=1
{
  modprobe rdma_rxe && modprobe ib_uverbs &&
  ip link set lo up &&
  $NET &&
  rdma link add rxe0 type rxe netdev \$RXE_NETDEV &&
  for i in \$(seq 50); do [ -e /dev/infiniband/uverbs0 ] && break; sleep 0.1; done &&
  [ -e /dev/infiniband/uverbs0 ]
} >/run/rxe-job/setup.log 2>&1 || setup_ok=0
if [ \$setup_ok = 0 ]; then echo "run-in-vm: rxe setup failed:"; cat /run/rxe-job/setup.log; fi
${RXE_VM_SETUP:-}
cd $(printf '%q' "$PWD") 2>/dev/null || cd /
$USERCMD
echo \$? > /run/rxe-job/rc
EOF

# ---- 5. boot --------------------------------------------------------------------
if [ "$ACCEL" = auto ]; then
    ACCEL=tcg
    if [ -w /dev/kvm ] && [ -d /sys/module/kvm_intel -o -d /sys/module/kvm_amd ]; then ACCEL=kvm; fi
fi
if [ "$ACCEL" = kvm ]; then CPU=host; else CPU=max; fi
QARGS=(-nodefaults -no-user-config -display none -no-reboot
       -machine "pc,accel=$ACCEL" -cpu "$CPU" -smp "$CPUS" -m "$MEM"
       -kernel "$C/vmlinux" -initrd "$C/initrd.gz"
       -serial "file:$JOB/console.log"
       -device virtio-serial-pci
       -chardev "file,id=out,path=/proc/self/fd/1" -device virtconsole,chardev=out
       -fsdev local,id=root,path=/,security_model=none,readonly=on,multidevs=remap
       -device virtio-9p-pci,fsdev=root,mount_tag=hostroot
       -fsdev "local,id=job,path=$JOB,security_model=none"
       -device virtio-9p-pci,fsdev=job,mount_tag=job)
if [ -n "$NODE" ]; then
    # two VMs (RXE_VM_NODE=a and =b, started at about the same time) joined by a
    # point-to-point virtual Ethernet carried in UDP datagrams on 127.0.0.1
    P=${RXE_VM_LINK_PORT:-47910}
    if [ "$NODE" = a ]; then L=$P R=$((P + 1)) MAC=52:54:00:77:01:01; else L=$((P + 1)) R=$P MAC=52:54:00:77:01:02; fi
    QARGS+=(-netdev "socket,id=n0,udp=127.0.0.1:$R,localaddr=127.0.0.1:$L"
            -device "virtio-net-pci,netdev=n0,mac=$MAC")
fi
APPEND="console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init mitigations=off tsc=reliable no_timer_check nowatchdog audit=0 random.trust_cpu=on"
if [ -n "$RWDIR" ]; then
    RWDIR=$(realpath "$RWDIR")
    case "$RWDIR" in *[[:space:]]*) log "RXE_VM_RWDIR must not contain spaces"; exit 2;; esac
    QARGS+=(-fsdev "local,id=rwdir,path=$RWDIR,security_model=none,multidevs=remap"
            -device virtio-9p-pci,fsdev=rwdir,mount_tag=rwdir)
    APPEND+=" rxevm.rwdir=$RWDIR"
fi
set +e
# "| cat": the guest console chardev writes to /proc/self/fd/1, which must be a
# pipe (a regular file would be reopened with O_TRUNC and a separate offset).
timeout --kill-after=10 "$TIMEOUT" "$QEMU" "${QEMU_FIRMWARE[@]}" "${QARGS[@]}" -append "$APPEND" </dev/null | cat
qrc=${PIPESTATUS[0]}
set -e
rc=$(cat "$JOB/rc" 2>/dev/null || echo 125)
[ "$qrc" = 124 ] || [ "$qrc" = 137 ] && { log "timed out after ${TIMEOUT}s"; rc=124; }
if [ "$rc" = 125 ] || [ "$rc" = 124 ] || [ "${RXE_VM_VERBOSE:-0}" = 1 ]; then
    log "qemu exit $qrc; guest kernel log:"; tail -n 60 "$JOB/console.log" >&2 || true
fi
exit "$rc"
