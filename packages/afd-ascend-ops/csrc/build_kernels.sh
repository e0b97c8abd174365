#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Written for this project (afd-ascend-ops): builds the AscendC custom op package of a2e/e2a for
# each SoC of op_registry.json and installs it into the Python package, under
# src/afd_ascend_ops/_cann_ops/<soc>/ (the vendor "afd": vendors/afd/op_api/lib/libcust_opapi.so
# holds aclnnA2e and aclnnE2a).
#
# Never run: it needs a CANN toolkit (msopgen, bisheng, cmake, CANN's set_env.sh sourced),
# which no machine of this project had. Untested as a whole; read it as the intended steps.
#
# Usage: csrc/build_kernels.sh [SOC ...]      (default: every SoC of op_registry.json)
# Environment: ASCEND_HOME_PATH (required), AFD_KERNEL_BUILD_DIR (default: <package>/build/kernels)
#
# Per SoC:
#   1. msopgen gen: a scaffold op project (CMake presets, build.sh, packaging) for the SoC's ops.
#      Its JSON only names the ops: their definitions (inputs, outputs, attributes, tiling,
#      shape inference) are ours, from <op>/op_host/*_def.cpp, which replace the generated ones.
#   2. our sources into the scaffold, flat: each op's op_host and op_kernel files, the shared
#      headers of common/ into both directories, common/op_host/ into op_host, common/op_kernel/
#      into op_kernel (every include is by plain name: no path climbs out of a directory the
#      build compiles), and op_host/afd_build_soc.h naming the SoC (afd_build_target.h).
#   3. the scaffold's build (cmake under build.sh) makes custom_opp_*.run.
#   4. the .run installs the package into the Python package.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PACKAGE=$(dirname "$HERE")
BUILD=${AFD_KERNEL_BUILD_DIR:-$PACKAGE/build/kernels}
INSTALL=$PACKAGE/src/afd_ascend_ops/_cann_ops
VENDOR=afd

die() { echo "build_kernels.sh: $*" >&2; exit 1; }

: "${ASCEND_HOME_PATH:?is unset: source the set_env.sh of the CANN toolkit first}"
for tool in msopgen bisheng cmake python3; do
    command -v "$tool" >/dev/null ||
        die "$tool is not on PATH; build inside a CANN image with set_env.sh sourced"
done

registry() { python3 - "$HERE/op_registry.json" "$@" <<'PY'
import json, sys
table = {soc: ops for soc, ops in json.load(open(sys.argv[1])).items() if not soc.startswith("_")}
if len(sys.argv) == 2:
    print(" ".join(table))
else:
    soc = sys.argv[2]
    if soc not in table:
        sys.exit(f"build_kernels.sh: {soc} is not in op_registry.json ({', '.join(table)})")
    print(" ".join(table[soc]))
PY
}

# The scaffold JSON msopgen wants: each op by its CamelCase name, one placeholder input and
# output (the real ones come from the op definitions copied in step 2), spelt as CANN's
# msopgen guide spells its example's ("float16", format "ND").
scaffold_json() { python3 - "$@" <<'PY'
import json, sys

def placeholder(name):
    return {"name": name, "param_type": "required", "format": ["ND"], "type": ["float16"]}

ops = [
    {
        "op": name.capitalize(),
        "language": "cpp",
        "input_desc": [placeholder("x")],
        "output_desc": [placeholder("y")],
    }
    for name in sys.argv[1:]
]
print(json.dumps(ops, indent=2))
PY
}

# Points the scaffold's presets at this CANN and SoC, and names the vendor.
set_presets() { python3 - "$1" "$2" "$VENDOR" "$ASCEND_HOME_PATH" <<'PY'
import json, sys
path, soc, vendor, cann = sys.argv[1:]
presets = json.load(open(path))
for preset in presets.get("configurePresets", []):
    variables = preset.get("cacheVariables", {})
    for key, value in (("vendor_name", vendor), ("ASCEND_COMPUTE_UNIT", soc),
                       ("ASCEND_CANN_PACKAGE_PATH", cann)):
        if key in variables:
            variables[key]["value"] = value
json.dump(presets, open(path, "w"), indent=2)
PY
}

socs=${*:-$(registry)}
for soc in $socs; do
    ops=$(registry "$soc")
    work=$BUILD/$soc
    project=$work/project
    echo "build_kernels.sh: $soc: $ops"
    rm -rf "$work"
    mkdir -p "$work"

    scaffold_json $ops > "$work/ops.json"
    msopgen gen -i "$work/ops.json" -c "ai_core-$soc" -lan cpp -out "$project"

    rm -f "$project"/op_host/*.cpp "$project"/op_host/*.h
    rm -f "$project"/op_kernel/*.cpp "$project"/op_kernel/*.h
    cp "$HERE"/common/*.h "$HERE"/common/op_host/*.h "$project/op_host/"
    cp "$HERE"/common/*.h "$HERE"/common/op_kernel/*.h "$project/op_kernel/"
    for op in $ops; do
        cp "$HERE/$op"/op_host/* "$project/op_host/"
        cp "$HERE/$op"/op_kernel/* "$project/op_kernel/"
    done
    printf '#pragma once\n#define AFD_BUILD_SOC "%s"\n' "$soc" > "$project/op_host/afd_build_soc.h"
    set_presets "$project/CMakePresets.json" "$soc"

    (cd "$project" && bash build.sh)
    run=$(ls "$project"/build_out/custom_opp_*.run 2>/dev/null | head -n 1)
    [ -n "$run" ] || die "$soc: the build made no custom_opp_*.run (see the log above)"
    rm -rf "${INSTALL:?}/$soc"
    mkdir -p "$INSTALL/$soc"
    bash "$run" --quiet --install-path="$INSTALL/$soc"
    echo "build_kernels.sh: $soc installed in $INSTALL/$soc/vendors/$VENDOR"
done
