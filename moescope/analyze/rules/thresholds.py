"""The numbers the diagnosis rules are tuned by.

Chosen so a healthy toy replay raises nothing (negative controls in ``tests/test_diagnosis.py``);
:mod:`moescope.analyze.diagnosis` says which rule reads each one.
"""

from __future__ import annotations

WINDOW = 10  # steps of history a spike or a jump is measured against
SUSTAIN = 3  # steps a shift must hold before it counts (and a flag run, for degenerate output)
# a level shift's running mean spans enough steps that the series' own step-to-step noise moves
# it by less than the shift: a per-step reward as noisy as its mean (a tiny batch) dipped by
# chance for three steps in a run of 20,000, read as a collapse. The noise is taken at the extremes
# a series of its length reaches by chance (the expected largest of n normal draws: 1.8 standard
# deviations for 25 steps, 3.9 for 20,000), at both ends (a lucky peak, then an unlucky trough),
# times NOISE_MARGIN
NOISE_MARGIN = 1.0
GRAD_SPIKE_FACTOR = 10.0  # a gradient-norm spike: this many times the running median...
GRAD_SPIKE_Z = 6.0  # ...and this many robust deviations (MAD of log norms) above it
GRAD_SPIKE_EXTREME = 1000.0  # with under 3 earlier gradient steps, only this big a jump counts
DIVERGENCE_FACTOR = 5.0  # a loss whose running median rises this many times its early level
# ...or one that ends on SUSTAIN or more new highs in a row, the last this many times the highest
# before them: no batch's noise sets three records in a row and half again over the log's range
# (a TF2 detector, 1.19-1.44 for six records, then 1.77, 2.16, 2.37)
CLIMB_OVER_RANGE = 1.5
# ...or one that rises on this many records in a row to CLIMB_OVER_RANGE times where it began: noise
# orders n records rising with a chance of 1/n!, 2.5e-5 for eight (CoTNet's loss, 22.9 to 39.5 at a
# fixed learning rate, 100 iterations a record)
STEADY_CLIMB = 8
# ...or, a critic's, one that climbs to this many times its lowest while the reward holds: a TD loss
# grows with the values it learns, and values grown 100-fold from a reward that holds ran away
RUNAWAY = 100.0
# ...or one that rises on this many records in a row while an accuracy logged beside it falls on every
# one of them: two measures ordered against each other by noise with a chance of 1/(n!)^2, 6.9e-5 for
# five (Keras#932, rmsprop: the loss 1.89 to 2.16 while the accuracy falls from 0.42 to 0.34)
PAIRED_CLIMB = 5
KL_BLOWUP_MIN = 1.0  # nats: a KL jump below this is never a blow-up
# nats per token: a policy's KL to its reference that no healthy run logs, judged on one record.
# Healthy GRPO / PPO runs log 1e-4 to about 1; at 10 the policy's own tokens are on average e^10
# times likelier under it than under the reference: no drift but a blow-up (torchforge#664: 1.6e+06)
KL_CEILING = 10.0
# a loss no healthy run logs, judged on one record: cross-entropies are nats per token (under 20
# even at initialisation), value and Q losses are squared errors of returns (a radar MSE of 2e4 and
# SAC Q-losses in the thousands were healthy in pasted logs); rlkit#50's diverged SAC logged a
# Q-loss of 1.4e+19 on the one snapshot the user pasted, set 10's paste a loss of 1e+13
LOSS_CEILING = 1e12
# a perplexity no healthy run logs: exp of a cross-entropy of 27.6 nats a token, twice the uniform guess
# over any vocabulary (ln 256,000 = 12.5); OpenNMT prints exp(100) = 2.69e43 once its loss passes 100
PERPLEXITY_CEILING = 1e12
LOAD_SHARE_FACTOR = 5.0  # an expert above this many times its uniform share is hot
# an fp16 loss scale driven this low overflows only where gradient elements pass 65504 / 128 = 512:
# the gradients blow up, whatever the scaler does (MiniLLM's run fell 128 → 32, LLaMA-Factory's to 8)
LOW_SCALE = 2.0**7
SETTLED_SCALE = 2.0**10  # an fp16 loss scale still this high after a run's first overflows: the
# scaler settling from its 2^16 or 2^32 start, with headroom left for small gradients
GRAD_NORM_CEILING = 1e5  # a gradient norm no healthy run logs: judged on one record, without history
# a cross-entropy logged as 0 (p ≈ 1 on every token) leaves next to no gradient (LLaMA-Factory pastes:
# 0.009-0.017, a Qwen SFT one 4e-6); a norm this large beside a loss of 0 is a loss that is 0 by
# construction (a GRPO policy loss whose keys the paste left out)
ZERO_LOSS_GRAD_MAX = 0.1
ZERO_LOSS = 1e-12  # a loss this close to 0 is 0: no token or sample scored, only a sum's rounding left
# a loss printed with this many significant digits never repeats exactly batch after batch: one
# that does on every record is pinned (a loss printed to 1-3 digits may repeat on a plateau)
PINNED_DIGITS = 4
HALF_DIGITS = 3  # what a loss printed from a float16 or bfloat16 number carries, whatever its decimals
# ...so such a loss is pinned only where it holds one value on this many records: a learning loss
# stays within one bfloat16 step (1/64 near 3, 1/16 near 10) a record or two by chance, not ten
# (MiniGPT-4#67: 10.3750, ln of LLaMA's 32,000 tokens in bfloat16, on every record)
HALF_HELD = 10
# ...or, printed with FINE_DIGITS or more (a print ten times finer than the spread), within this
# share of its value on every record (DINO's collapsed run, dino#246: 11.090327 to 11.090333 over
# 11 epochs, 5e-7 of itself); printed coarser, a change in the last digit is a change
PINNED_SPREAD = 1e-5
FINE_DIGITS = 7
# a learning rate below this moves no weight: Adam's step is about the rate, under float32's
# resolution (2^-24 of a weight) for any weight above 1e-8, and an SGD step is the rate times a
# gradient that is finite (Informer2020#469: halved each epoch for 900 epochs, to 7e-280)
VANISHED_LR = 1e-15
# a classifier's loss held at ln K, a uniform guess among K classes, on SUSTAIN or more records: within
# this share of ln K (r2c's VCR run: 1.386393 to 1.386330 beside ln 4 = 1.386294; Lasagne's MNIST
# CNN's validation loss 2.303229 to 2.301416 beside ln 10 = 2.302585) and within this share of the
# distance to ln(K ± 1), past half a unit of the last digit printed, which must tell K from K ± 1
CHANCE_SPREAD = 1e-3
CHANCE_RESOLUTION = 0.25
# ...or, on one record, a loss within GUESS_LOSS_SHARE of ln K beside an accuracy within GUESS_SHARE
# of 1/K, two numbers that name the same guess (ConvNeXt on two classes after 300 epochs: loss
# 0.6883 beside ln 2 = 0.6931, class_acc 0.5352)
GUESS_LOSS_SHARE = 0.01
GUESS_SHARE = 0.1
# a model getting worse at its own training data: the median training loss of the last third of the
# records this many times that of the first third while the median accuracy falls to this share of
# its own (an SFT run "degrading": ms-swift#3617, loss 2.81 -> 5.29 while token_acc 0.46 -> 0.22)
WORSE_LOSS = 1.5
WORSE_ACCURACY = 2 / 3
FLAT_SHARE = 0.01  # a loss that moves by less than this share of itself over some records does not fall
# ...nor, where two error rates hold at 100 beside it, one falling by less than this share: a CTC model
# that emits only blanks creeps down while every word stays wrong (SpeechBrain's wav2vec2 at 3.11 to
# 2.89 over four epochs, fairseq's valid_loss 898 to 885, both at a WER of 100)
STUCK_SHARE = 0.05
# a loss of exactly 0 scores every sample certain and right: beside an accuracy below this, of the
# same split, it is no loss of the predictions (Keras's val_loss 0.0000e+00 beside val_acc 0.37)
CERTAIN_SHARE = 0.95
# an accuracy held to its third decimal on WINDOW records or more at this share or less is one
# class's, balanced or not (MNIST's most frequent digit is 11.35 % of its test set)
ONE_CLASS_SHARE = 0.2
# a language model's perplexity held at or above PLATEAU_PPL (a unigram model's level, or worse) on
# PLATEAU_RECORDS or more records a log ends on, within PLATEAU_SPREAD of its mean in loss and
# without falling by FLAT_SHARE / 2 from the first third of them to the last: no update improves it
# (transformer-xl#95: 7.30-7.33 at ppl 1,500 over 1,800 steps; a fine-tune's 11.49-11.63)
PLATEAU_PPL = 300.0
PLATEAU_RECORDS = 8
PLATEAU_SPREAD = 0.02
# ...and one whose last records repeat, value for value, those a fixed number of steps before them
# (an epoch's batches scored again by a model that did not change): this many records at least
REPLAYED_RUN = 5
LBL_IMBALANCED = 2.0  # Megatron's load-balancing loss (logged unscaled) is 1 when balanced, E/top-k at
# worst; 2 is as unbalanced as half the experts idle and the rest evenly loaded
RECOMPUTE_DOUBLE_MAX = 2.5  # Megatron's LBL below this could be a balanced router's counted twice (recompute)
MISMATCH_K3_HIGH = 0.1  # k3 KL(rollout ‖ training) above the 1e-3–1e-1 band practitioners see on MoE RL
MISMATCH_K3_FLOOR = 1e-3  # ...and a rise counts only above the top of the dense-model band (1e-5–1e-3)
# mean |rollout − training log-prob| per token: ~0.011 with a sound engine and 0.036 with a faulty
# one (vime#64); held at 0.1, the two engines disagree on the tokens themselves
MISMATCH_LOGPROB_HIGH = 0.1
MISMATCH_MULT_PROB_HIGH = 1.05  # NeMo-RL's token_mult_prob_error (1 when equal): a recipe asserts <= 1.05
# share of tokens whose token-level PPO/GRPO ratio is clipped, held (healthy GRPO: ~0.001-0.05,
# moescope's token-level replays <= 0.08; GSPO's sequence-level clipping ~0.15 by design, not judged)
CLIPFRAC_HIGH = 0.2
# share of replayed expert choices the trainer's own router also makes: ~0.99 with one engine,
# ~0.95 under an fp8 rollout (toy, routing_mismatch + routing_replay); routes shifted by a token
# or from another step share ~0.15-0.4 on the toys, up to ~0.65 on their 1/4 proxies (fewer experts:
# chance, k/E, is higher)
ROUTE_OVERLAP_LOW = 0.8
# a load-balancing loss counted twice: this many times its previous record (within AUX_DOUBLE_TOL)
AUX_DOUBLE = 2.0
AUX_DOUBLE_TOL = 0.25
# ...while the expert load's CV moves by less than this share (a 1/4 proxy's moves ~30% a step)
LOAD_STEADY = 0.5
# the importance weights' effective sample size as a fraction of the batch, 1 / mean(w²) of weights
# normalised to mean 1: verl's rollout-IS docs (docs/advance/rollout_is.md) call > 0.5 ideal and
# < 0.3 "high variance, losing too many effective samples"; a tenth of that on one record leaves
# the update to a handful of samples
IS_ESS_LOW = 0.3
IS_ESS_SEVERE = 0.03
MISMATCH_RISE = 3.0  # a mismatch whose running median rises this many times its early level
