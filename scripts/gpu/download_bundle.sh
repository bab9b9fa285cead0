#!/usr/bin/env bash
# Download (here, where a registry is reachable) the wheels the H200 image lacks, in three sets:
#   vllm   - ../shared/reference/vllm-0.26.0-h200-wheels.txt
#   sglang - ../shared/reference/sglang-0.5.17-h200-wheels.txt
#   tuner  - the tuner's own dependencies missing on the image (optuna 5 and its needs, pydantic, sniffio,
#            plotly for the report and its narwhals, the image's narwhals version being unknown)
# Each set is installed into its own --target folder on the machine (their pins conflict); the files
# are pooled here so a wheel needed by two sets travels once. Set lists name the files actually
# downloaded (pip may pick another manylinux tag of the same version, e.g. manylinux2014 for 2_28).
# Usage: [SETS="tuner vllm"] scripts/gpu/download_bundle.sh [BUNDLE_DIR]   (default .gpubundle, git-ignored)
# SETS (default "vllm sglang tuner") names the sets to download; a lease that boots vLLM alone leaves sglang out.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-.gpubundle}
SETS=${SETS:-vllm sglang tuner}
REF=${REF:-../shared/reference}
mkdir -p "$B/wheels" "$B/sets"
PLAT=()
for n in 5 17 24 26 27 28 31 34 35; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLAT[@]}" -d "$B/wheels" "$@" 2>&1 | grep -v "^WARNING: Location" || true; }

# wheel filename -> NAME==VERSION
specs_of() { grep -v '^#' "$1" | grep -v '^$' | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/'; }

specs_of "$REF/vllm-0.26.0-h200-wheels.txt" > "$B/sets/vllm.in"
specs_of "$REF/sglang-0.5.17-h200-wheels.txt" > "$B/sets/sglang.in"
# The tuner's needs (pyproject.toml) that the image lacks; versions as in the dev venv.
cat > "$B/sets/tuner.in" <<'EOF'
optuna==5.0.0
alembic==1.20.1
colorlog==6.12.0
Mako==1.4.3
SQLAlchemy==2.1.9
pydantic==2.14.4
pydantic_core==2.50.5
annotated-types==0.8.0
typing-inspection==0.4.5
typing_extensions==4.16.0
sniffio==1.3.1
plotly==7.1.0
narwhals==2.29.0
EOF
for set in $SETS; do dl -r "$B/sets/$set.in"; done

python3 - "$B" $SETS <<'EOF'
import re, sys
from pathlib import Path
b = Path(sys.argv[1])
norm = lambda n: re.sub(r"[-_.]+", "_", n).lower()
have = {}
for w in sorted((b / "wheels").glob("*.whl")):
    name, version = w.name.split("-")[:2]
    have.setdefault((norm(name), version), w.name)
for s in sys.argv[2:]:
    files = []
    for spec in (b / "sets" / f"{s}.in").read_text().split():
        name, version = spec.split("==")
        f = have.get((norm(name), version))
        if f is None:
            sys.exit(f"{s}: no wheel for {spec}")
        files.append(f)
    (b / "sets" / f"{s}.txt").write_text("\n".join(files) + "\n")
    print(s, len(files), "wheels")
EOF
echo "downloaded: $(ls "$B/wheels" | wc -l) files, $(du -sh "$B/wheels" | cut -f1)"
