#!/bin/sh
# Installs this microagent bundle into a prefix (default /usr/local):
#   ./install.sh [--prefix DIR]
# It copies bin/, libexec/, share/ and lib/ there; nothing else is changed.
# Then, once, as root: `microagent setup --yes` (Debian packages, the kvm
# group, the VMMs' account); every user in the kvm group then runs
# `microagent run -- uname -a` with state under their own home.
set -eu
# Directories every user of the kvm group can read, whatever root's umask.
umask 022

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
case "$prefix" in
  /*) ;;
  *) prefix=$(pwd)/$prefix ;;
esac
case "$prefix" in
  / | //) echo "install.sh: refusing / as the prefix; give a directory such as /usr/local or /opt/microagent" >&2; exit 2 ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
for part in bin libexec share lib; do
  [ -d "$here/$part" ] || { echo "install.sh: $here/$part is missing; unpack the whole bundle" >&2; exit 1; }
done

# As root, every directory on the way to the prefix and under it must be
# root's and writable by no one else (sticky ones, like /tmp, excepted):
# whoever could write one could swap what root installs and every user
# then runs. The prefix is made first, so no one else can make it between
# the check and the copy.
root_only() {
  d=$1
  if [ -L "$d" ]; then
    echo "install.sh: refusing $d: it is a symbolic link; give the real directory" >&2; exit 1
  fi
  [ -e "$d" ] || return 0
  owner=$(stat -c %u "$d"); mode=$(stat -c %a "$d")
  others_write=$(( 0$mode & 022 )); sticky=$(( 0$mode & 01000 ))
  if [ "$owner" != 0 ] || { [ "$others_write" != 0 ] && [ "$sticky" = 0 ]; }; then
    echo "install.sh: refusing $d: it is not root's alone (owner $owner, mode $mode); install into a directory only root can write" >&2
    exit 1
  fi
}
as_root=
if [ "$(id -u)" = 0 ]; then
  as_root=1
  d=$(dirname "$prefix")
  while [ "$d" != / ]; do root_only "$d"; d=$(dirname "$d"); done
  root_only "$prefix"
  mkdir -p "$prefix"
  root_only "$prefix"
fi

# Each file is copied beside its place and renamed over it: a running
# microagent or VMM keeps its old file (no "text file busy"), and a file
# an image registry linked to is never rewritten in place.
for part in bin libexec share lib; do
  (cd "$here" && find "$part" -mindepth 0) | while IFS= read -r rel; do
    src=$here/$rel
    dest=$prefix/$rel
    if [ -d "$src" ] && [ ! -L "$src" ]; then
      if [ -L "$dest" ]; then
        echo "install.sh: refusing $dest: it is a symbolic link where a directory goes" >&2; exit 1
      fi
      if [ -n "$as_root" ]; then root_only "$dest"; fi
      mkdir -p "$dest"
    else
      tmp=$dest.install-$$
      rm -f "$tmp"
      cp -P --preserve=mode,timestamps --sparse=always "$src" "$tmp"
      mv -fT "$tmp" "$dest"
    fi
  done
done

echo "installed microagent into $prefix"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "add $prefix/bin to PATH" ;;
esac
echo "next: as root, once: $prefix/bin/microagent setup   (shows its plan: packages, the kvm group; then --yes)"
echo "then: microagent run -- uname -a"
