#!/usr/bin/env bash
# Fashion-MNIST (data sets fashion_mnist, fashion_mosaic) from the Debian package dataset-fashion-mnist,
# which puts the four official IDX files in /usr/share/datasets/fashion-mnist/. Installed quietly
# where this runs as root with apt-get; otherwise, or when installing fails (no network, another
# distribution), one line says how to get the files. Never fails: setup must not depend on it.
# FASHION_MNIST_DIR overrides the folder checked (tests).
folder=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[ -f "$folder/train-images-idx3-ubyte.gz" ] && exit 0
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; }
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # a fresh container has no package lists: update once, only if the first try fails
  install || { apt-get update -qq >/dev/null 2>&1 && install; } && exit 0
fi
echo "setup: Fashion-MNIST is not installed (data sets fashion_mnist, fashion_mosaic): run 'sudo apt-get install dataset-fashion-mnist', or train with data.download=true"
exit 0
