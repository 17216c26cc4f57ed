"""The iterative self-play pipeline as a plain library (the KFP components call it).

config   PipelineConfig: one YAML for `sparring run|compile|submit`
tasks    the spine: start, game_init, initial_model, warm_start, rollout, train, evaluate,
         register, finish
league   the opponent league's state across iterations (schedule, `past-<k>` models)
reports  the evaluation page and the run summary
io       the storage layout and progress lines
local    `sparring run`: the whole pipeline on this machine under kfp.local
"""
