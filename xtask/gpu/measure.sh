#!/bin/bash
# The unmeasured rows of issues #30 and #33 on one warm H200, in parts (PARTS, in order), each
# skipped when less than its share of BUDGET_S (default 570 s) is left, carrying .gpu/a and
# .gpu/c of `cargo xtask gpu pack` (spec_gpu.sh, spec_cost.py and this script copied into .gpu/c):
#   setup  product_setup.sh with MODELS (skipped when /opt/models holds them all);
#   test   graph_decode_cuda's TESTS (default batched_equals_single) capped at TEST_S, with
#          TEST_ENV's assignments (e.g. "MLX_GRAPH_MV_NB=1") in its environment alone;
#   ktest  mlx-kernels' `cuda` test set, KTESTS (default trellis_kernels_match_the_cpu_references)
#          capped at KTEST_S;
#   spec   spec_gpu.sh (draft-model speculation on the graph decoder, forced acceptance: cost
#          against the ideal, tokens against plain greedy graph decoding; SPEC_PAIRS, SPEC_ROUNDS);
#   bench  product.sh's bench only (BENCH_MODELS, ROUNDS; `mlx benchmark --decoder auto|mlx` and
#          `mlx_lm benchmark`, with peak memory, and the copy bandwidth);
#   moe    the Qwen3-30B-A3B-shaped 4-bit model written, then one bench round of the three sides;
#   probe  spec_probe.py on the echo pair (a speculative round's parts timed alone, mlx-lm's models);
#   serve  batched.sh's serve bench only (SERVE_MODELS, SERVE_SIDES, SERVE_CLIENTS, MAX_BATCH);
#   thru   batched.sh's `batched_throughput` only (THRU_MODELS, default llama31-8b-q4; ROWS,
#          default "1 2 4 8 16"), tensor-core tiles from 4 rows, once with the wide tiles (one
#          of 8 or 16) and once without (MLX_GRAPH_WIDE_TILES=0), with each part's time a step
#          (MLX_GRAPH_BATCH_BREAKDOWN=BREAKDOWN, default 20 replays), into throughput.log;
#          THRU_SIDES (default "on 1") picks the runs: on = the defaults (wide tiles, MMA_ASYNC
#          and MV_ASYNC), 1 wide with both switches off, 0 narrow, async = wide tiles with
#          the cp.async ring (MLX_GRAPH_MMA_ASYNC=1), mv = wide tiles with the FFMA row kernels'
#          deferred scale/bias reads (MLX_GRAPH_MV_ASYNC=1; the other sides run with it off),
#          banks = both plus the wide tiles' bank-conflict-free placement (MLX_GRAPH_MMA_BANKS=1);
#          pair = on with the wide tiles' items of two rows blocks (MLX_GRAPH_MMA_PAIR=1),
#          pairbanks = banks with them;
#          ffma = main's defaults (MMA_ASYNC and MV_ASYNC on) with the FFMA row kernels at every
#          width (MLX_GRAPH_BATCH_MMA=99: the verify rows' kernels, 2 tiles of 5 at 9 rows of the
#          8B),
#          early = on with the norm weights loaded before the wait (MLX_GRAPH_EARLY_PROLOGUE=1),
#          nb = ffma with the FFMA tiles' constant-slot loop
#          (MLX_GRAPH_MV_NB=1); ffma4 and nb4 = ffma and nb at 4 rows a warp
#          (THRU_MV_ROWS=4: batched.sh's MLX_GRAPH_BATCH_MV_ROWS);
#   trellis  issue #34's decode row: each of TRELLIS_MODELS (affine 4-bit dirs setup wrote) gets a
#          trellis-3 twin (trellis_bench_model.py, copied into .gpu/c: L 8, blocks of 32, random
#          codes), then `mlx benchmark` on both, `--decoder auto` and `--decoder mlx`, alternating,
#          TRELLIS_ROUNDS rounds (the JSON names the decoder that ran and why auto fell back);
#          TRELLIS_DECODERS=auto skips `--decoder mlx` (on CUDA the MLX path runs trellis decode
#          steps through the host's CPU kernel: slow, minutes for the 8B). TRELLIS_TWINS picks the
#          twins (default t3): t3 = 3 bits, L 8, blocks of 32, 1mad; t3m8 = the same with the
#          1mad8 code (`--q-trellis-code 1mad8`: the kernels' table path); t3l12 = 3 bits, L 12,
#          blocks of 64 (`mlx convert`'s default shape), 1mad; t3m8h = the same with the 1mad8h
#          code (`--q-trellis-code 1mad8h`: the table at hashed indices); t3g7 = the same with
#          gauss7s (the S-box and its 128-entry table); t3g8 = gauss8s; t3m8s = 1mad8s; t3hy =
#          the hybrid (gauss7s, the value projections 1mad: `--q-trellis-v-code 1mad`).
#          TRELLIS_BASE=0 skips the affine models themselves (a second run's switches A/B).
#          The trellis kernels' switches are the model's shape's choice (graph_trellis.rs
#          TrellisSwitches: 1,024 threads, ALIAS and PIPE from hidden 4,096) unless the
#          environment's MLX_GRAPH_TRELLIS_* override them. TRELLIS_SIDES (default "default") runs
#          each twin once a side: default = the shape's choice, states = with
#          MLX_GRAPH_TRELLIS_STATES=1, pair = with MLX_GRAPH_TRELLIS_PAIR=1, both = with both
#          (the affine models once, in the first side). TRELLIS_NEED (default 120) is the
#          seconds the part wants left to start.
# Logs under $OUT, packed into logs-$TAG.tgz at the end (parts.log and spec_table.md beside it).
C=.gpu/c
export PYTHONUNBUFFERED=1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
B=${BUDGET_S:-570}
left() { echo $((B - SECONDS)); }
need() {  # PART SECONDS: whether SECONDS are left for PART
  if [ $(left) -lt $2 ]; then echo "== skip $1: $(left) s left, wants $2" | tee -a $OUT/parts.log; return 1; fi
  echo "== $1 at ${SECONDS} s ($(uptime))" | tee -a $OUT/parts.log
}
for part in ${PARTS:-setup test spec bench moe}; do
  case $part in
    setup)
      need setup 60 && timeout $(left) bash .gpu/a/product_setup.sh > $OUT/setup.log 2>&1
      tail -3 $OUT/setup.log ;;
    test)
      [ -f $C/graph_test.xz ] || { echo "== skip test: no graph_test.xz" | tee -a $OUT/parts.log; continue; }
      need test 60 || continue
      export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache
      mkdir -p /opt/bin && xz -dc $C/graph_test.xz > /opt/bin/graph_test && chmod +x /opt/bin/graph_test
      mkdir -p mlx-models/tests/models && tar xJf $C/fixtures.tar.xz -C mlx-models/tests/models
      T=${TEST_S:-240}; [ $T -gt $(left) ] && T=$(left)
      echo "== test switches: $(env | grep '^MLX_GRAPH_TRELLIS\|^MLX_GRAPH_MMA\|^MLX_GRAPH_EARLY' | sort | tr '\n' ' ')${TEST_ENV:+ TEST_ENV: $TEST_ENV}" >> $OUT/graph_test.log
      env $TEST_ENV timeout $T /opt/bin/graph_test --test-threads 1 --nocapture ${TESTS:-batched_equals_single} >> $OUT/graph_test.log 2>&1
      echo "test rc=$?" >> $OUT/graph_test.log; tail -4 $OUT/graph_test.log ;;
    ktest)
      [ -f $C/kernels_test.xz ] || { echo "== skip ktest: no kernels_test.xz" | tee -a $OUT/parts.log; continue; }
      need ktest 30 || continue
      export LD_LIBRARY_PATH="$SITE/mlx/lib" MLXS_GPURT_CACHE=/tmp/gpurt-cache
      mkdir -p /opt/bin && xz -dc $C/kernels_test.xz > /opt/bin/kernels_test && chmod +x /opt/bin/kernels_test
      T=${KTEST_S:-90}; [ $T -gt $(left) ] && T=$(left)
      echo "== ktest switches: $(env | grep '^MLX_GRAPH_TRELLIS' | sort | tr '\n' ' ')" >> $OUT/kernels_test.log
      timeout $T /opt/bin/kernels_test --test-threads 1 --nocapture ${KTESTS:-trellis_kernels_match_the_cpu_references} >> $OUT/kernels_test.log 2>&1
      echo "ktest rc=$?" >> $OUT/kernels_test.log; tail -6 $OUT/kernels_test.log ;;
    spec)
      need spec 60 && SPEC_S=60 timeout $(left) bash $C/spec_gpu.sh > $OUT/spec_run.log 2>&1
      tail -20 $OUT/spec_run.log ;;
    bench)
      need bench 60 || continue
      SKIP_TEST=1 MODELS="${BENCH_MODELS:-llama-135m-bf16 llama31-8b-q4}" GEN_MODELS=" " SERVE_MODELS= \
        timeout $(left) bash $C/product.sh > $OUT/bench_run.log 2>&1
      grep -h "averages\|Averages\|== round\|copy bandwidth" $OUT/bench.log $OUT/copy_bw.log | cut -c1-220 ;;
    probe)
      need probe 60 || continue
      timeout $(left) python3 $C/spec_probe.py /opt/models/${PROBE_TARGET:-echo-llama31-8b-q4} \
        /opt/models/${PROBE_DRAFT:-echo-llama-135m-v128k-bf16} > $OUT/spec_probe.jsonl 2> $OUT/spec_probe.err
      cut -c1-200 $OUT/spec_probe.jsonl; tail -3 $OUT/spec_probe.err ;;
    serve)
      need serve 120 || continue
      SKIP_TEST=1 THRU_MODELS=" " timeout $(left) bash $C/batched.sh > $OUT/serve_run.log 2>&1
      grep -h "== serve\|clients\|tok/s\|decoder\|serve profile" $OUT/serve.log | cut -c1-520 ;;
    thru)
      need thru 120 || continue
      # THRU_SIDES: 1 = wide tiles, 0 = MLX_GRAPH_WIDE_TILES=0, async = wide tiles with the
      # cp.async ring (MLX_GRAPH_MMA_ASYNC=1), mv = wide tiles with MLX_GRAPH_MV_ASYNC=1, on =
      # wide tiles with both (the defaults since session 37), banks = on plus the wide tiles'
      # bank-conflict-free placement (MLX_GRAPH_MMA_BANKS=1), pair = on with the wide tiles'
      # items of two rows blocks (MLX_GRAPH_MMA_PAIR=1: the decoder's default since session 46,
      # so `on` is the default before it), pairbanks = banks with them, ffma = the defaults with the FFMA
      # tiles at every width (MLX_GRAPH_BATCH_MMA=99), early = on with
      # MLX_GRAPH_EARLY_PROLOGUE=1, nb = ffma with
      # MLX_GRAPH_MV_NB=1, ffma4 / nb4 = ffma / nb at 4 rows a warp (THRU_MV_ROWS=4), w512 = ffma
      # with MLX_GRAPH_MV_WIDE=1 (the FFMA tiles' 512-thread blocks), w512r4 = ffma4 with it; each
      # side runs with the switches it does not name off.
      for side in ${THRU_SIDES:-on 1}; do
        wide=$side; ring=0; mv=0; banks=0; mma=4; early=0; mvnb=0; mvrows=2; mvwide=0; pair=0
        [ $side = async ] && wide=1 ring=1
        [ $side = mv ] && wide=1 mv=1
        [ $side = on ] && wide=1 ring=1 mv=1
        [ $side = banks ] && wide=1 ring=1 mv=1 banks=1
        [ $side = pair ] && wide=1 ring=1 mv=1 pair=1
        [ $side = pairbanks ] && wide=1 ring=1 mv=1 banks=1 pair=1
        [ $side = ffma ] && wide=1 ring=1 mv=1 mma=99
        [ $side = early ] && wide=1 ring=1 mv=1 early=1
        [ $side = nb ] && wide=1 ring=1 mv=1 mma=99 mvnb=1
        [ $side = ffma4 ] && wide=1 ring=1 mv=1 mma=99 mvrows=4
        [ $side = nb4 ] && wide=1 ring=1 mv=1 mma=99 mvnb=1 mvrows=4
        [ $side = w512 ] && wide=1 ring=1 mv=1 mma=99 mvwide=1
        [ $side = w512r4 ] && wide=1 ring=1 mv=1 mma=99 mvwide=1 mvrows=4
        echo "== MLX_GRAPH_WIDE_TILES=$wide MLX_GRAPH_MMA_ASYNC=$ring MLX_GRAPH_MV_ASYNC=$mv MLX_GRAPH_MMA_BANKS=$banks MLX_GRAPH_BATCH_MMA=$mma MLX_GRAPH_EARLY_PROLOGUE=$early MLX_GRAPH_MV_NB=$mvnb MLX_GRAPH_MV_WIDE=$mvwide MLX_GRAPH_MMA_PAIR=$pair THRU_MV_ROWS=$mvrows" >> $OUT/throughput.log
        SKIP_TEST=1 SERVE_MODELS=" " THRU_MODELS="${THRU_MODELS:-llama31-8b-q4}" ROWS="${ROWS:-1 2 4 8 16}" \
          MLX_GRAPH_BATCH_MMA=$mma MLX_GRAPH_WIDE_TILES=$wide MLX_GRAPH_MMA_ASYNC=$ring MLX_GRAPH_MV_ASYNC=$mv \
          MLX_GRAPH_MMA_BANKS=$banks MLX_GRAPH_EARLY_PROLOGUE=$early \
          MLX_GRAPH_MV_NB=$mvnb MLX_GRAPH_MV_WIDE=$mvwide THRU_MV_ROWS=$mvrows \
          MLX_GRAPH_MMA_PAIR=$pair \
          MLX_GRAPH_BATCH_BREAKDOWN=${BREAKDOWN:-20} timeout $(left) bash $C/batched.sh \
          > $OUT/thru_run_$side.log 2>&1
      done
      grep -h "==\|batched_throughput" $OUT/throughput.log | cut -c1-300 ;;
    moe)
      need moe 120 || continue
      timeout $(left) python3 .gpu/a/bench_models.py /opt/models qwen3-30b-a3b-q4 > $OUT/moe.log 2>&1
      cp /opt/tok/tokenizer*.json /opt/models/qwen3-30b-a3b-q4/
      export LD_LIBRARY_PATH="$SITE/mlx/lib"
      mkdir -p /opt/bin && [ -x /opt/bin/mlx ] || { xz -dc $C/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx; }
      for side in mlxlm graph mlx mlxlm graph; do
        [ $(left) -lt 20 ] && break
        echo "== moe $side" >> $OUT/moe.log
        case $side in
          graph) timeout $(left) /opt/bin/mlx benchmark --model /opt/models/qwen3-30b-a3b-q4 -p 512 -g 128 -n 3 --json --decoder auto 2>&1 | grep -v '^{"prompt"' ;;
          mlx) timeout $(left) /opt/bin/mlx benchmark --model /opt/models/qwen3-30b-a3b-q4 -p 512 -g 128 -n 3 --json --decoder mlx 2>&1 | grep -v '^{"prompt"' ;;
          mlxlm) timeout $(left) python3 -m mlx_lm benchmark --model /opt/models/qwen3-30b-a3b-q4 -p 512 -g 128 -n 3 2>&1 ;;
        esac >> $OUT/moe.log
      done
      grep -h "written\|averages\|Averages\|== moe\|decoder" $OUT/moe.log | cut -c1-220 ;;
    trellis)
      need trellis ${TRELLIS_NEED:-120} || continue
      export LD_LIBRARY_PATH="$SITE/mlx/lib"
      mkdir -p /opt/bin && [ -x /opt/bin/mlx ] || { xz -dc $C/mlx.xz > /opt/bin/mlx && chmod +x /opt/bin/mlx; }
      TM=${TRELLIS_MODELS:-llama-135m-q4 llama31-8b-q4}
      TW=${TRELLIS_TWINS:-t3}
      for m in $TM; do
        for t in $TW; do
          case $t in
            t3) o="--bits 3 --trellis-l 8 --block 32" ;;
            t3m8) o="--bits 3 --trellis-l 8 --block 32 --code 1mad8" ;;
            t3l12) o="--bits 3 --trellis-l 12 --block 64" ;;
            t3m8h) o="--bits 3 --trellis-l 12 --block 64 --code 1mad8h" ;;
            t3g7) o="--bits 3 --trellis-l 12 --block 64 --code gauss7s" ;;
            t3g8) o="--bits 3 --trellis-l 12 --block 64 --code gauss8s" ;;
            t3m8s) o="--bits 3 --trellis-l 12 --block 64 --code 1mad8s" ;;
            t3hy) o="--bits 3 --trellis-l 12 --block 64 --code gauss7s --v-code 1mad" ;;
            *) echo "== TRELLIS_TWINS: unknown twin $t" >> $OUT/trellis.log; continue ;;
          esac
          timeout $(left) python3 $C/trellis_bench_model.py /opt/models/$m /opt/models/$m-$t $o \
            >> $OUT/trellis.log 2>&1
        done
      done
      SIDES=${TRELLIS_SIDES:-default}
      for r in $(seq ${TRELLIS_ROUNDS:-2}); do
        for m in $TM; do
          for v in $([ "${TRELLIS_BASE:-1}" = 1 ] && echo $m) $(for t in $TW; do echo $m-$t; done); do
            for side in $SIDES; do
              # The affine model takes no trellis switch: once, in the first side.
              [ $v = $m ] && [ $side != ${SIDES%% *} ] && continue
              case $side in
                default) se= ;;
                states) se=MLX_GRAPH_TRELLIS_STATES=1 ;;
                pair) se=MLX_GRAPH_TRELLIS_PAIR=1 ;;
                both) se="MLX_GRAPH_TRELLIS_STATES=1 MLX_GRAPH_TRELLIS_PAIR=1" ;;
                *) echo "== TRELLIS_SIDES: unknown side $side" >> $OUT/trellis.log; continue ;;
              esac
              for d in ${TRELLIS_DECODERS:-auto mlx}; do
                [ $(left) -lt 30 ] && break 5
                echo "== trellis round $r $v --decoder $d side $side switches: $(env $se | grep '^MLX_GRAPH_TRELLIS' | sort | tr '\n' ' ')" >> $OUT/trellis.log
                env $se timeout $(left) /opt/bin/mlx benchmark --model /opt/models/$v -p ${P:-512} -g ${G:-128} \
                  -n ${N:-3} --json --decoder $d 2>&1 | grep -v '^{"trial"' >> $OUT/trellis.log
              done
            done
          done
        done
      done
      grep -h "written\|== trellis\|averages" $OUT/trellis.log | cut -c1-260 ;;
  esac
done
echo "measure-done at ${SECONDS} s" | tee -a $OUT/parts.log
# A call returns at most 8 files: everything in one archive, the summary beside it.
rm -f $OUT/spec_err.tmp
(cd $OUT && tar czf logs-${TAG:-run}.tgz --exclude='logs-*.tgz' --exclude=parts.log . && find . -maxdepth 1 -type f ! -name 'logs-*.tgz' ! -name parts.log ! -name spec_table.md ! -name spec_profile.log -delete)
