"""verl training backend (route 1, online self-play inside verl; see README "Scale up: GPU backends").

agent_loop  the registered `sparring_selfplay` loop: whole games, focal-seat masks, reward
data        dataset rows (initial state x seat) so that uid groups "same state, same seat"
advantage   the `sparring_grpo` estimator for custom group keys (role, country)
launch      the `verl.trainer.main_ppo` command line and the FSDP -> HF merge
"""
