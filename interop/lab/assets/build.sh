#!/bin/bash
# Builds the interop guest: a Debian rootfs by debootstrap, then a kernel and an initramfs that holds
# the whole (trimmed) rootfs. Called by the lab package with:
#   DIR (output directory), SUITE, MIRROR, PKGS (comma separated), MODS (space separated),
#   ROOTFS_KEY and IMAGE_KEY (hashes of the inputs; a step reruns only when its key changed),
#   ASSETS (directory holding init and cmd).
set -euo pipefail
: "${DIR:?}" "${SUITE:?}" "${MIRROR:?}" "${PKGS:?}" "${MODS:?}" "${ROOTFS_KEY:?}" "${IMAGE_KEY:?}" "${ASSETS:?}"
ROOTFS="$DIR/rootfs"
mkdir -p "$DIR"

# A failed debootstrap can leave /proc or /sys mounted in the rootfs: unmount before deleting it.
unmount_rootfs() {
  awk -v r="$ROOTFS/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount -l "$m" || true
  done
}

if [ "$(cat "$ROOTFS/.goroce-rootfs-key" 2>/dev/null)" != "$ROOTFS_KEY" ]; then
  for attempt in 1 2; do
    unmount_rootfs
    rm -rf --one-file-system "$ROOTFS" "$DIR/image-key"
    echo "goroce-interop: debootstrap $SUITE -> $ROOTFS (attempt $attempt)"
    if debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$ROOTFS" "$MIRROR"; then
      echo "$ROOTFS_KEY" > "$ROOTFS/.goroce-rootfs-key"
      break
    fi
    cp "$ROOTFS/debootstrap/debootstrap.log" "$DIR/debootstrap-failed.log" 2>/dev/null || true
    unmount_rootfs
    [ "$attempt" = 2 ] && { echo "goroce-interop: debootstrap failed (log: $DIR/debootstrap-failed.log)" >&2; exit 1; }
  done
fi

if [ "$(cat "$DIR/image-key" 2>/dev/null)" = "$IMAGE_KEY" ] && [ -s "$DIR/vmlinuz" ] && [ -s "$DIR/initrd.gz" ]; then
  exit 0
fi
kver=$(ls "$ROOTFS/lib/modules" | sort -V | tail -1)
[ -n "$kver" ] || { echo "goroce-interop: no kernel in $ROOTFS" >&2; exit 1; }
echo "goroce-interop: packing the initramfs (kernel $kver)"
stage="$DIR/stage"
rm -rf "$stage"; mkdir -p "$stage"
tar -C "$ROOTFS" --exclude=./lib/modules --exclude=./usr/lib/modules --exclude=./boot \
    --exclude=./usr/share/doc --exclude=./usr/share/man --exclude=./usr/share/locale \
    --exclude=./usr/share/info --exclude=./var/cache/apt --exclude=./var/lib/apt/lists \
    --exclude=./usr/lib/firmware --exclude=./lib/firmware -cf - . | tar -C "$stage" -xf -
# The modules the guest loads, with their dependencies as the rootfs's depmod data resolves them.
for f in $(for m in $MODS; do chroot "$ROOTFS" modprobe -S "$kver" --show-depends "$m" 2>/dev/null; done \
           | awk '$1=="insmod"{print $2}' | sort -u); do
  mkdir -p "$stage$(dirname "$f")"; cp -a "$ROOTFS$f" "$stage$f"
done
mkdir -p "$stage/lib/modules/$kver"
cp -a "$ROOTFS/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$stage/lib/modules/$kver/" 2>/dev/null || true
depmod -b "$stage" "$kver" 2>/dev/null || chroot "$stage" depmod "$kver"
install -m 0755 "$ASSETS/init" "$stage/init"
install -m 0755 "$ASSETS/cmd" "$stage/usr/local/bin/goroce-guest-cmd"
rm -f "$stage/etc/resolv.conf"
echo "$kver" > "$stage/etc/goroce-kernel"
(cd "$stage" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$DIR/initrd.gz.tmp"
cp "$ROOTFS/boot/vmlinuz-$kver" "$DIR/vmlinuz.tmp"
mv "$DIR/initrd.gz.tmp" "$DIR/initrd.gz"
mv "$DIR/vmlinuz.tmp" "$DIR/vmlinuz"
echo "$kver" > "$DIR/kernel-version"
rm -rf "$stage"
echo "$IMAGE_KEY" > "$DIR/image-key"
ls -l "$DIR/vmlinuz" "$DIR/initrd.gz"
