# The two stages of a card's study (sourced, no side effects: common.sh on the device, archive.sh
# here). A block's call 1 carries both stages' archives, and the card it gets picks one
# (pick_stage.sh): the study of that card is either still sampling its 18 trials or at its finalists.
# Before session 47 a block carried one stage, chosen before the card was known, and a machine whose
# study was at the other stage ran nothing (RUNBOOK, "Two studies, one per card").
STAGES=(sampling finalists)
# The tag each stage runs from (RUNBOOK: the finalists' tag holds main's fix that stores each repeat
# as it ends; the sampled trials ran from gpu-study-1).
stage_tag() {
  case "$1" in sampling) echo gpu-study-1 ;; finalists) echo gpu-study-1-finalists ;; esac
}
# The search's settings for the stage (study.sh): the finalists are each tier's best and each
# engine's defaults on three fresh boots each, the stress check, then `tuner verify` (issue 26).
stage_env() {
  case "$1" in
    sampling) echo "FINALISTS=0 REPEATS=0 STRESS=0 VERIFY=0" ;;
    finalists) echo "FINALISTS=1 REPEATS=3 STRESS=1 VERIFY=1" ;;
  esac
}
# Where the stage's `git archive` is kept here and carried (its commit beside it, .commit for .tar.gz).
stage_archive() { echo ".gpubundle/stage-$1.tar.gz"; }
