"""The iterative self-play pipeline as a plain library (the KFP components call it).

config   PipelineConfig: one YAML for `sparring run|compile|submit`
plan     which iterations run, their games, which register each waits for
runner   run_loop: the one loop in this process (`sparring run`, the benches)
tasks    the spine: start, game_init, initial_model, warm_start, rollout, train, evaluate,
         register, finish
league   the opponent league's state across iterations (schedule, `past-<k>` models)
recent   each role's last 100 learner plays across iterations (rolling per-country metrics)
reports  the evaluation page and the run summary
io       the storage layout and progress lines
local    `sparring run`: local services, the loop (in-process or kfp.local), the summary
services the local S3 and MLflow stand-ins `sparring run` starts when none is configured
verl_task  `train_backend: verl`: one task that plays and trains inside verl
"""
