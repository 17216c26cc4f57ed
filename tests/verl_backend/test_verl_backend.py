"""The verl backend on CPU: the agent loop driven by the tiny model, dataset rows, and the
launch command composed by verl's own Hydra config (the registered estimator:
test_verl_group_estimator.py). The GPU parts (SGLang servers, FSDP workers, Ray) are not run here.

`HFServerManager` stands in for verl's LLM server manager: the same
`await generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput` call, served by
the real HFBackend (a stand-in for the GPU server, not a mock of the loop's logic).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
from verl.workers.rollout.replica import TokenOutput

from sparring.game_init import GameInitConfig, generate_inits
from sparring.games import GameSpec, make_game
from sparring.generation.base import SamplingParams
from sparring.generation.hf import HFBackend
from sparring.samples import TokenTrace
from sparring.verl_backend.agent_loop import (
    AGENT_NAME,
    SeatTrace,
    SparringSelfPlayLoop,
    focal_output,
)
from sparring.verl_backend.data import selfplay_rows, write_rows
from sparring.verl_backend.launch import (
    VerlConfig,
    latest_actor_dir,
    merge_command,
    verl_overrides,
    write_agent_loop_config,
)

GAME_PARAMS = {"k": 3, "max_turns": 4}
VERL_CONFIG_DIR = Path(__import__("verl").__file__).parent / "trainer" / "config"


class HFServerManager:
    """verl's `server_manager.generate` shape, generating with the tiny model."""

    def __init__(self, backend: HFBackend) -> None:
        self.backend = backend
        self.calls: list[tuple[str, list[int], list[int]]] = []  # request_id, prompt, output

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        params = SamplingParams(
            temperature=sampling_params["temperature"],
            top_p=sampling_params["top_p"],
            max_new_tokens=sampling_params["max_new_tokens"],
            seed=len(self.calls),
        )
        (out,) = self.backend.generate([prompt_ids], params, sessions=[request_id])
        self.calls.append((request_id, list(prompt_ids), out.token_ids))
        return TokenOutput(token_ids=out.token_ids, log_probs=[-0.5] * len(out.token_ids))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf(tiny_model_dir) -> HFBackend:
    return HFBackend(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="module")
def rows():
    cfg = GameInitConfig(
        game={"name": "matching", "params": GAME_PARAMS}, num_train=2, num_val=1, seed=3
    )
    inits = generate_inits(cfg, progress=False)
    train = inits[inits.split == "train"]
    import json

    return selfplay_rows(
        [(r.init_id, json.loads(r.state)) for r in train.itertuples()], GameSpec(params=GAME_PARAMS)
    )


def _loop(tiny_model_dir, tokenizer, server) -> SparringSelfPlayLoop:
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 512, "response_length": 1536}}}
    )
    return SparringSelfPlayLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(OmegaConf.create({})),
        max_new_tokens=12,
    )


# ---- agent loop ---------------------------------------------------------------------------
@pytest.mark.parametrize("focal", [0, 1])
def test_agent_loop_plays_a_whole_game_and_masks_the_focal_seat(
    tiny_model_dir, tokenizer, hf, rows, focal
):
    server = HFServerManager(hf)
    row = rows[rows.extra_info.map(lambda e: e["seat"]) == focal].iloc[0]
    loop = _loop(tiny_model_dir, tokenizer, server)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    out = asyncio.run(loop.run(sampling, raw_prompt=row.prompt, extra_info=row.extra_info))

    # Every seat generated through the server, one stable request_id per seat.
    ids = {rid for rid, _, _ in server.calls}
    assert len(ids) == 2 and {rid.rsplit("/", 1)[1] for rid in ids} == {"0", "1"}
    mine = [c for c in server.calls if c[0].endswith(f"/{focal}")]
    theirs = [c for c in server.calls if not c[0].endswith(f"/{focal}")]
    assert mine and theirs
    # Each focal prompt extends the previous one: the seat's context grows turn by turn.
    for (_, p0, o0), (_, p1, _) in zip(mine, mine[1:], strict=False):
        assert p1[: len(p0) + len(o0)] == p0 + o0

    # The first focal prompt is the prompt; mask 1 exactly on the focal seat's own tokens.
    assert out.prompt_ids == mine[0][1]
    full = out.prompt_ids + out.response_ids
    own = [t for _, _, o in mine for t in o]
    assert [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m] == own
    assert out.response_mask[0] == 1 and out.response_mask[-1] == 1
    assert 0 in out.response_mask  # the partner's turns and scaffolding are there, mask 0
    assert full[-len(mine[-1][2]) :] == mine[-1][2]  # ends on the focal seat's last reply
    assert out.response_logprobs == [-0.5 if m else 0.0 for m in out.response_mask]

    # Replaying the transcript with the same game gives the same outcome and turn count.
    game = make_game("matching", **GAME_PARAMS)
    game.reset(__import__("json").loads(row.extra_info["state"]))
    assert out.num_turns == game.max_turns or out.extra_fields["truncated"] is False
    assert out.reward_score == 0.0  # a random tiny model never agrees on a proposal
    # verl's own conversion puts the reward on the last response token, a focal-seat token.
    d = out.as_dict()
    assert d["rm_scores"][-1] == out.reward_score and d["rm_scores"][:-1].abs().sum() == 0
    assert d["response_mask"][-1] == 1


def test_focal_output_reward_placement_and_caps(tokenizer):
    trace = TokenTrace(tokenizer)
    msgs = [{"role": "user", "content": "hi"}]
    prompt = trace.prompt(msgs)
    reply = tokenizer.encode("[message] ok", add_special_tokens=False) + [tokenizer.eos_token_id]
    trace.reply(msgs + [{"role": "assistant", "content": "[message] ok"}], reply)
    msgs += [{"role": "assistant", "content": "[message] ok"}, {"role": "user", "content": "x"}]
    trace.prompt(msgs)  # partner's turn after the last reply: must not be in the response
    seat = SeatTrace(trace, [0.0] * len(prompt) + [-1.0] * len(reply))
    out = focal_output(seat, 0.7, 3, True, prompt_length=512, response_length=512)
    assert out.prompt_ids == prompt and out.response_ids == reply
    assert out.response_mask == [1] * len(reply) and out.response_logprobs == [-1.0] * len(reply)
    assert out.as_dict()["rm_scores"].tolist() == pytest.approx([0.0] * (len(reply) - 1) + [0.7])
    cut = focal_output(seat, 0.7, 3, False, prompt_length=4, response_length=2)
    assert cut.prompt_ids == prompt[-4:] and cut.response_ids == reply[:2]
    assert cut.response_logprobs is None
    silent = focal_output(SeatTrace(TokenTrace(tokenizer), []), 0.2, 0, False, 512, 512)
    with pytest.raises(IndexError):  # no tokens at all: nothing to hang a reward on
        silent.as_dict()


def test_agent_loop_is_registered_and_config_file_instantiates(tmp_path):
    assert _agent_loop_registry[AGENT_NAME]["_target_"].endswith("SparringSelfPlayLoop")
    path = write_agent_loop_config(tmp_path / "loops.yaml", VerlConfig(max_new_tokens=99))
    (entry,) = OmegaConf.load(path)
    assert entry.name == AGENT_NAME and entry.max_new_tokens == 99
    assert entry._target_ == "sparring.verl_backend.agent_loop.SparringSelfPlayLoop"


# ---- dataset rows -------------------------------------------------------------------------
def test_rows_are_state_by_seat_and_replay_the_prompt(rows, tmp_path):
    assert len(rows) == 2 * 2  # 2 train states x 2 seats
    assert set(rows.agent_name) == {AGENT_NAME}
    keys = [(e["init_id"], e["seat"]) for e in rows.extra_info]
    assert len(set(keys)) == len(keys)
    for row in rows.itertuples():
        game = make_game("matching", **GAME_PARAMS)
        game.reset(__import__("json").loads(row.extra_info["state"]))
        assert list(row.prompt) == game.messages(row.extra_info["seat"])
        assert (
            row.extra_info["group_key"] == f"{row.extra_info['init_id']}/{row.extra_info['seat']}"
        )
    back = __import__("pandas").read_parquet(write_rows(rows, tmp_path / "train.parquet"))
    assert back.extra_info[0]["state"] == rows.extra_info[0]["state"]
    with pytest.raises(ValueError, match="no `country` group key"):
        selfplay_rows(
            [("s", __import__("json").loads(rows.extra_info[0]["state"]))],
            GameSpec(params=GAME_PARAMS),
            group_key="country",
        )


# ---- the launch (the registered estimator: test_verl_group_estimator.py) -------------------
def test_overrides_compose_with_verls_own_config(tmp_path):
    from hydra import compose, initialize_config_dir

    cfg = VerlConfig(n_gpus_per_node=4, tp_size=2, rollout_n=6, kl_coef=0.01)
    loops = write_agent_loop_config(tmp_path / "loops.yaml", cfg)
    args = verl_overrides(
        cfg, "/models/m", "/d/train.parquet", "/d/val.parquet", str(tmp_path / "out"), str(loops)
    )
    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        composed = compose(config_name="ppo_trainer", overrides=args)
    r = composed.actor_rollout_ref.rollout
    assert composed.algorithm.adv_estimator == "sparring_group"
    assert (r.name, r.n, r.tensor_model_parallel_size, r.multi_turn.enable) == (
        "sglang",
        6,
        2,
        True,
    )
    assert r.agent.agent_loop_config_path == str(loops)
    assert composed.actor_rollout_ref.actor.use_kl_loss is True
    assert composed.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert composed.trainer.default_local_dir == str(tmp_path / "out" / "ckpt")
    assert composed.trainer.resume_mode == "auto" and composed.trainer.save_freq == 10
    assert r.prompt_length == 1024 and r.response_length == 4096  # interpolated from data.*
    # A typo'd key is rejected by verl's schema, so the test above really checks the keys.
    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        with pytest.raises(Exception, match="multi_turns"):
            compose(
                config_name="ppo_trainer",
                overrides=["actor_rollout_ref.rollout.multi_turns.enable=True"],
            )


def test_verl_config_validation():
    with pytest.raises(ValueError, match="multiple of ppo_mini_batch_size"):
        VerlConfig(train_batch_size=10, ppo_mini_batch_size=4)
    with pytest.raises(ValueError, match="multiple of tp_size"):
        VerlConfig(n_gpus_per_node=3, tp_size=2)
    with pytest.raises(ValueError, match=r"(?s)rollout_n.*greater than or equal to 2"):
        VerlConfig(rollout_n=1)


def test_merge_command_picks_the_latest_actor(tmp_path):
    for step in (5, 40, 100):
        (tmp_path / "ckpt" / f"global_step_{step}" / "actor").mkdir(parents=True)
    (tmp_path / "ckpt" / "global_step_200").mkdir()  # no actor yet: skipped
    cmd = merge_command(tmp_path / "ckpt", tmp_path / "hf", python="python")
    assert cmd[:6] == ["python", "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
    assert cmd[cmd.index("--local_dir") + 1] == str(tmp_path / "ckpt/global_step_100/actor")
    assert latest_actor_dir(tmp_path / "ckpt").parent.name == "global_step_100"
    with pytest.raises(FileNotFoundError, match="no global_step"):
        latest_actor_dir(tmp_path / "empty")
