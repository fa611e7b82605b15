#!/bin/sh
# Installs this microagent bundle into a prefix (default /usr/local):
#   ./install.sh [--prefix DIR]
# It copies bin/, libexec/, share/ and lib/ there; nothing else is changed.
# Then, once, as root: `microagent setup --yes` (Debian packages, the kvm
# group, the VMMs' account); every user in the kvm group then runs
# `microagent run -- uname -a` with state under their own home.
set -eu

prefix=/usr/local
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }
              prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (usage: install.sh [--prefix DIR])" >&2; exit 2 ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
for part in bin libexec share lib; do
  [ -d "$here/$part" ] || { echo "install.sh: $here/$part is missing; unpack the whole bundle" >&2; exit 1; }
done
mkdir -p "$prefix"
for part in bin libexec share lib; do
  mkdir -p "$prefix/$part"
  # Links kept (the minimal image's), holes kept (its rootfs), modes kept.
  cp -R -P --preserve=mode,timestamps --sparse=always "$here/$part/." "$prefix/$part/"
done

echo "installed microagent into $prefix"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "add $prefix/bin to PATH" ;;
esac
echo "next: as root, once: $prefix/bin/microagent setup --yes   (packages, the kvm group)"
echo "then: microagent run -- uname -a"
