#!/usr/bin/env bash
# The course on another torch release (and, optionally, another Python): a venv of its own, the
# course installed in it, then nbval over every chapter and worked solution (their stored outputs
# must hold there too; --notebooks narrows that), optionally after the unit tests. Used by .ci/run
# (the torch floor, Colab's pair) and by hand for the README's "Tested on" table (Kaggle's torch,
# the newest release).
# The first argument is a torch version, or a name from pyproject.toml's [tool.course.matrix]
# (course, floor, colab, kaggle, newest): its torch, and its Python where it names one (colab).
#
#   tools/other_torch.sh floor --unit-tests --older-isa --tests tests/test_cluster_ranks.py  # CI part 3
#   tools/other_torch.sh colab --unit-tests --tests tests/test_cluster_ranks.py \
#       --notebooks "$(echo chapters/[0-9][0-9]_*.ipynb)"   # CI part 4 (.ci/run: the exact lines)
#   tools/other_torch.sh kaggle --all-tests                 # Kaggle's torch, by hand
#   tools/other_torch.sh 2.12.0                             # any release
#
# --python X.Y   a Python X.Y found on PATH (pythonX.Y) or under pyenv; it fails loudly if none is
# --unit-tests   run the unit tier (`pytest tests --unit`: no processes, no notebooks) first
# --all-tests    run every test file (`pytest tests -m "not wheel"`) first
# --tests FILE   also run this test file before the notebooks (repeatable)
# --deselect ID  leave out this test (a pytest node id) of those --tests names (repeatable)
# --older-isa    ATen's and MKL's kernels held to older vector instructions (the matrix's floor.env:
#                ATEN_CPU_CAPABILITY=default, MKL_ENABLE_INSTRUCTIONS=SSE4_2)
# --venv DIR     where the venv goes (default .venv-torch-VERSION); an existing one is reused
# --prepare      build the venv and stop (.ci/run builds them while its first parts run)
# --torch-only   build the venv with its torch only and stop (.ci/run fetches the torches first,
#                while its fast gate runs, and installs the course beside them later)
# --notebooks P  the folders (or notebooks) nbval runs, space-separated (default "chapters solutions")
# torch releases are CUDA builds on Linux (several GB); they run on the CPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

usage() { sed -n '2,28p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
matrix() { python3 tools/matrix.py "$1" || exit 2; }  # a value of pyproject.toml's version matrix
version=$1 python_version=""
shift
case "$version" in
    [0-9]*) ;;
    *) name=$version
       version=$(matrix "$name.torch") || exit 2
       python_version=$(python3 tools/matrix.py "$name.python" 2>/dev/null) ;;  # where it names one
esac
unit="" isa=() venv="" tests=() deselect=() prepare=0 torch_only=0 notebooks=(chapters solutions)
while [ $# -gt 0 ]; do
    case "$1" in
        --python) python_version=${2:?--python needs X.Y}; shift 2 ;;
        --unit-tests) unit=(--unit); shift ;;
        --all-tests) unit=(-m "not wheel"); shift ;;
        --prepare) prepare=1; shift ;;
        --torch-only) torch_only=1; shift ;;
        --older-isa) read -ra isa <<<"$(matrix floor.env)" && [ "${#isa[@]}" -gt 0 ] || exit 2; shift ;;
        --venv) venv=${2:?--venv needs a folder}; shift 2 ;;
        --tests) tests+=("${2:?--tests needs a test file}"); shift 2 ;;
        --deselect) deselect+=(--deselect "${2:?--deselect needs a test id}"); shift 2 ;;
        --notebooks) read -ra notebooks <<<"${2:?--notebooks needs folders}"; shift 2 ;;
        *) usage ;;
    esac
done
venv=${venv:-.venv-torch-$version}

# A Python X.Y: pythonX.Y on PATH, else pyenv's X.Y.*; checked by running it.
find_python() {
    local wanted=$1 candidate
    for candidate in "python$wanted" \
            $(command -v pyenv >/dev/null && pyenv versions --bare 2>/dev/null \
              | grep -E "^${wanted//./\\.}(\\.[0-9]+)?\$" \
              | sed "s|^|$(pyenv root 2>/dev/null)/versions/|; s|\$|/bin/python$wanted|"); do
        if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$wanted'.split('.'))))" \
                2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

python=python3
if [ -n "$python_version" ]; then
    python=$(find_python "$python_version") || {
        echo "other_torch.sh: no Python $python_version found (neither python$python_version on PATH nor a pyenv $python_version.x)" >&2
        exit 1
    }
fi

start=$(date +%s)
"$python" -m venv "$venv" || exit 1
. "$venv/bin/activate"
pip install --quiet --no-compile "torch==$version" || exit 1
if [ "$torch_only" -eq 1 ]; then
    echo "other_torch.sh: torch $version in $venv after $(( $(date +%s) - start )) s"
    exit 0
fi
pip install --quiet --no-compile -r requirements.txt || exit 1
python -c "import sys, torch; print('torch', torch.__version__, 'on Python', sys.version.split()[0]); \
sys.exit(not torch.__version__.startswith('$version'))" || exit 1
echo "other_torch.sh: venv ready after $(( $(date +%s) - start )) s"
[ "$prepare" -eq 0 ] || exit 0

rc=0
if [ -n "$unit" ]; then
    # the wheel's tests (build, install, run from outside the checkout) test packaging, which no
    # torch release changes: the README's command runs them once, on the course's torch
    env "${isa[@]}" python -m pytest -q tests "${unit[@]}"
    rc=$?
    echo "other_torch.sh: tests (${unit[*]}) on torch $version: exit $rc after $(( $(date +%s) - start )) s"
fi
if [ "$rc" -eq 0 ] && [ "${#tests[@]}" -gt 0 ]; then
    env "${isa[@]}" python -m pytest -q "${tests[@]}" "${deselect[@]}"
    rc=$?
    echo "other_torch.sh: ${tests[*]} on torch $version: exit $rc after $(( $(date +%s) - start )) s"
fi
if [ "$rc" -eq 0 ]; then
    env "${isa[@]}" python -m pytest -q --nbval "${notebooks[@]}"
    rc=$?
    echo "other_torch.sh: ${notebooks[*]} on torch $version${isa:+ (older ISA)}: exit $rc after $(( $(date +%s) - start )) s"
fi
exit "$rc"
