#!/usr/bin/env bash
# llama.cpp's own GGUF converter (convert_hf_to_gguf.py with its conversion/ and gguf-py/), taken from the pinned
# llama-cpp-python source package into $SPECDEC_HOME/llama.cpp/: the tests convert tiny checkpoints that
# transformers wrote with it, so their GGUF tensor names and metadata are llama.cpp's, not specdec's
# (tests/helpers/qwen35.py). Nothing is built; only those files are kept. Once per machine.
set -euo pipefail
VERSION=0.3.36
DEST="${SPECDEC_HOME:-$HOME/.cache/specdec}/llama.cpp/llama-cpp-python-$VERSION"
[ -f "$DEST/convert_hf_to_gguf.py" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp"
src="llama_cpp_python-$VERSION/vendor/llama.cpp"
tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp" "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py"
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.part"
mv "$tmp/$src" "$DEST.part"
mv "$DEST.part" "$DEST"
