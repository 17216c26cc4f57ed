"""verl training backend (route 1, online self-play inside verl; see README "Scale up: GPU backends").

agent_loop  the registered `sparring_selfplay` loop: whole games, focal-seat masks, reward
data        dataset rows (initial state x seat), each labelled with its group under group_key
estimator   the registered `sparring_group` advantage estimator: GRPO over those labels
task        the pipeline's verl task: write the rows, run main_ppo, merge the checkpoint
launch      the `verl.trainer.main_ppo` command line and the FSDP -> HF merge
"""
