#!/usr/bin/env bash
# Initialisation ablation for summarization, same fine-tuning budget for every arm:
#   random (minilm preset)  |  own encoder MLM-pretrained on WikiText-2 (train.pretrain)
#   MiniLM warm start (BERT2BERT)  |  MiniLM warm start, BERTShare
# Usage: bash bench/ablation.sh [OUT_DIR]   (needs ../shared; ~75 min on 2 idle CPU cores)
# Knobs (environment): STEPS, MLM_STEPS, PY. Results: OUT_DIR/*/trainer_state.json, and the
# table printed by `python -m bench.ablation_table OUT_DIR` at the end.
set -euo pipefail
OUT=${1:-logs/ablation}
PY=${PY:-python}
STEPS=${STEPS:-300}
MLM_STEPS=${MLM_STEPS:-400}
SHARED=${SHARED:-../shared}
MINILM=$SHARED/models/minilm-l6-h384-uncased
FT=(-m train.finetune --data "$SHARED/data/cnndm/train.jsonl.gz" --val-data "$SHARED/data/cnndm/val.jsonl.gz"
    --limit 8000 --max-source-len 192 --max-target-len 64 --batch-size 16 --lr 2e-4 --warmup-steps 30
    --max-steps "$STEPS" --eval-every "$STEPS" --save-every 100 --keep-last 1
    --val-examples 200 --rouge-examples 100 --log-every 10)
mkdir -p "$OUT"
run() { local name=$1; shift; [ -f "$OUT/$name/done" ] && return; "$PY" "$@" --out "$OUT/$name" --resume && touch "$OUT/$name/done"; }

run mlm_wikitext2 -m train.pretrain --data "$SHARED/data/wikitext2" --preset minilm --batch-size 32 --block-size 128 \
    --lr 5e-4 --warmup-steps 40 --max-steps "$MLM_STEPS" --eval-every "$MLM_STEPS" --save-every 100 --keep-last 1 \
    --val-batches 10 --log-every 10
MLM_CKPT=$(ls -d "$OUT"/mlm_wikitext2/checkpoints/step_* | tail -1)
run ft_random "${FT[@]}" --preset minilm
run ft_own_mlm "${FT[@]}" --init "$MLM_CKPT"
run ft_minilm "${FT[@]}" --init "$MINILM"
run ft_minilm_share "${FT[@]}" --init "$MINILM" --share
"$PY" -m bench.ablation_table "$OUT"
