# one device check for issue 31: the CUDA value-field test, the value-field tests, the fields bench
PY=$(command -v python3 || command -v python)
for p in /opt/conda/bin/python /usr/bin/python3 $(ls -d /*/venv*/bin/python /root/.venv/bin/python 2>/dev/null); do
  [ -x "$p" ] && "$p" -c "import torch" 2>/dev/null && PY=$p && break
done
echo "PY=$PY"; $PY -c "import torch, numpy, PIL; print(torch.__version__, torch.cuda.is_available(), numpy.__version__)" 2>&1
$PY -c "import click, zarr, pyarrow, pytest" 2>&1 | tail -1
nproc
export PYTHONPATH=$PWD
timeout 200 $PY -m pytest -q -x -p no:cacheprovider tests/test_cuda.py -k value_fields 2>&1 | tail -15
timeout 120 $PY -m pytest -q -x -p no:cacheprovider tests/test_value_fields.py -k "not remote" 2>&1 | tail -5
timeout 200 $PY benchmarks/bench_fields.py 2>&1 | tail -5
