cd /work/wt/i21 && export PYTHONPATH=$PWD OMP_NUM_THREADS=1
for a in equal upgrad uncertainty; do
nice /work/main/.venv/bin/python scripts/train_mtl.py --config configs/synthetic/cog_fc.yaml train.epochs=2 data.synthetic.train_size=256 data.synthetic.val_size=64 data.synthetic.test_size=64 tracking=none output_dir=/tmp/i21runs run_name=smoke_$a mtl.aggregator=$a --overwrite 2>&1 | grep -i "epoch\|weights\|error\|Trace\|mtl" | head -8
done
