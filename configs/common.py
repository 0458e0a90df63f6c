"""Defaults shared by every config, each written once here: model runtime, mesh, sharding rules, prompt, stages."""
import ml_collections
from ml_collections.config_dict import placeholder

from rmsweb_jax.models.sharding import DEFAULT_RULES


def train_overrides() -> ml_collections.ConfigDict:
    """Returns a stage's train block (ground.train, base.train): each field None keeps config.train's value
    (rmsweb_jax/stages/train_overrides.py), so a stage can train at its own batch, steps and learning rate."""
    block = ml_collections.ConfigDict()
    block.batch_size = placeholder(int)
    block.total_steps = placeholder(int)
    block.lr = placeholder(float)
    block.warmup_steps = placeholder(int)
    block.end_lr_fraction = placeholder(float)
    return block


def base_config() -> ml_collections.ConfigDict:
    """Returns the config every preset starts from; presets override fields."""
    c = ml_collections.ConfigDict()
    c.stages = ("model",)
    c.seed = 0
    c.rerun = ""                          # stages run even when their manifests say up to date: "all" | "mine,salvage"
    c.force_unlock = False                # take the workdir's lock from the run holding it (rmsweb_jax/workdir_lock.py):
                                          # only when that run is gone and its lock stays; it names the run displaced
    c.ablations = ""                      # stage "table": Salvage-DS ablation rows to run beside RMSWeb: "" none,
                                          # "all", or names from stages/table.py ABLATION_NAMES, comma-separated
                                          # (e.g. "salvage_kl_off,rl_all_states"); True / False = "all" / ""
    c.rl_seeds = 0                        # stage "table": this many more Salvage-DS runs from the same SFT export
                                          # and states (salvage.seed + 1 .. + n), each a row, and RMSWeb - SFT
                                          # averaged over all n + 1 (one RL run's seed alone moved it 5.7 points)

    c.model = ml_collections.ConfigDict()
    c.model.init = "random:tiny"          # 'hf:/path/to/Qwen3-VL-8B-Instruct' or 'random:tiny'
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"         # none | full | dots | dots_with_no_batch_dims | save_attention_out
    c.model.attention_impl = "auto"       # auto (xla on CPU, splash on TPU, cudnn on GPU) | xla | splash | cudnn
    c.model.scan_layers = True            # False: Python loop over layers (faster steps, compile grows with depth)
    c.model.decode_layout = "auto"        # auto (per_layer on one CPU device, copies up to 2 GiB) | stacked | per_layer
    c.model.decode_sharding = "auto"      # on a mesh: auto (the cheaper step, models/sharding.py) | tensor | replicated
                                          # | training (no copy: FSDP weights gathered per token)
    c.model.group_decode = "cascade"      # G samples of a prompt: cascade (one prompt KV cache read once per group
                                          # + each row's own) | copy (the prompt's cache copied to the G rows)
    c.model.decode_compaction = 2         # times the decode loop may halve its rows as they finish (0: never;
                                          # single-device programs only)
    c.model.vision_window = 4096          # most patches one image may have; vision attention then costs linear, not
                                          # quadratic, in a microbatch's images. A 1280x720 screenshot: smart_resize
                                          # -> 1280x704 -> 80x44 = 3520 patches of 16, rounded up to 4096 as
                                          # configs/pod_slices.py budgets it. Larger images are refused; 0 = no window

    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (1, -1, 1)             # (data, fsdp, tensor); -1 takes the remaining devices
    c.sharding_rules = [list(r) for r in DEFAULT_RULES]

    c.tpu = ml_collections.ConfigDict()
    c.tpu.libtpu_init_args = ""           # libtpu compiler flags, '--name=value ...', put in LIBTPU_INIT_ARGS before
                                          # JAX starts (the pod presets: configs/pod_slices.py); "" = libtpu's own

    c.smoke = ml_collections.ConfigDict()
    c.smoke.instruction = "Click the Submit button."
    c.smoke.max_new_tokens = 24
    c.smoke.temperature = 0.0
    c.smoke.min_pixels = 16384
    c.smoke.max_pixels = 65536

    # The one prompt every stage builds (rmsweb_jax/agents/prompt.py PromptConfig): collect, sft, action_accuracy.
    c.prompt = ml_collections.ConfigDict()
    c.prompt.observation = "screenshot"   # the current page as: screenshot | elements (a text list of the page's
                                          # elements, centre in the action's coordinates, value, state; no
                                          # image) | both
    c.prompt.system = "qwen_tools"        # qwen_tools (Qwen's tool block, full schema: real checkpoints) | compact
    c.prompt.history_steps = 4            # earlier steps shown as text (thought + action)
    c.prompt.history_images = 1           # of those, the last k also with their screenshot (<= history_steps)
    c.prompt.max_elements = 50            # at most this many elements listed
    c.prompt.max_element_name = 80        # accessible names cut to this many characters (>= 8)
    c.prompt.reflection_images = 1        # screenshots of the failed attempt's last steps in the reflection prompt
    c.prompt.local_ports = False          # URLs on 127.0.0.1 / localhost shown without their port (a local server's
                                          # port, MiniWoB++'s, changes each run); True where the port tells sites apart

    # Reflection-conditioned retries (stage "collect"; rmsweb_jax/stages/collect.py).
    c.collect = ml_collections.ConfigDict()
    c.collect.suite = "miniwob"           # miniwob | webvoyager | online_mind2web | webtailbench (live: the open web)
    c.collect.tasks = ""                  # comma-separated task ids; "" = the teacher's task types (miniwob) or
                                          # every task of task_list (live suites)
    c.collect.task_list = ""              # the suite's task file: miniwob_tasks.csv ("" = the packaged table), or the
                                          # benchmark's .jsonl/.json ("" = the file that `python -m
                                          # rmsweb_jax.suites.download` put in $RMSWEB_DATA, default
                                          # ~/.cache/rmsweb_jax/benchmarks)
    c.collect.reference_answers = ""      # webvoyager only: reference_answer.json, stored with each task
    c.collect.limit = 0                   # at most this many of the selected tasks; 0 = all
    c.collect.first_seed = 0
    c.collect.num_seeds = 2               # seeds first_seed .. first_seed + num_seeds - 1 per task (live sites
                                          # cannot be seeded: there each seed is one more independent run)
    c.collect.attempts = 3                # K: attempt 1 + up to K-1 retries (collect.retry_mode)
    c.collect.retry_mode = "reflection"   # reflection: retries see the policy's reflections | plain: no reflection
                                          # (no reflect() call), the policy's randomness re-drawn per attempt (a
                                          # greedy model repeats itself); one store holds one mode
    c.collect.workers = 2                 # browser workers (and the policy's batch size)
    c.collect.max_steps = 15              # click-checkboxes-large needs up to 12 moves; live tasks want ~30
    c.collect.episode_time_limit_s = 0.0  # MiniWoB++'s in-page time limit; 0 = none
    c.collect.step_timeout_s = 15.0
    c.collect.pool_max_attempts = 3      # runs of an episode the browser pool makes when browsers crash
    c.collect.fault_reruns = 1           # then whole reruns of the attempt (same attempt number, never a retry)
    c.collect.viewport = (1280, 720)      # live suites' browser viewport (MiniWoB++ pages set their own)
    c.collect.extra_hosts = ""            # live suites: comma-separated hosts added to every task's allowlist
    c.collect.policy = "teacher"          # teacher (miniwob only) | flax:<model spec> | http:<base_url>#<model>;
                                          # the reflector is the policy's own reflect()
    c.collect.judge = ""                  # "" = the suite's official judge: programmatic (miniwob), webvoyager,
                                          # webjudge (online_mind2web), webtailbench — the LLM ones need an endpoint:
                                          # "<base_url>#<model>" (official judge) or "<judge>:<base_url>#<model>";
                                          # programmatic is refused on live suites. A judge error ends its task
                                          # group unsolved (no reflection), counted in the report.
    c.collect.success = "solved"          # programmatic judge: solved (raw reward >= 1 - 1e-6) | positive_reward (> 0,
                                          # counts MiniWoB++'s partial credit, e.g. a wrong checkbox, as solved)
    c.collect.judge_api_key_env = ""      # env var holding the judge endpoint's API key ("" = none)
    c.collect.judge_screenshots = 0       # screenshots an LLM judge sees: webvoyager/webtailbench the last k,
                                          # webjudge at most k kept; 0 = the judge's default (3, 3, 50)
    c.collect.api_key_env = ""            # env var holding the http policy endpoint's API key ("" = none)
    c.collect.max_new_tokens = 256
    c.collect.temperature = 0.0
    c.collect.teacher = ml_collections.ConfigDict()  # ScriptedTeacher's injected mistakes (per step)
    c.collect.teacher.wrong_element_p = 0.15
    c.collect.teacher.detour_p = 0.15
    c.collect.teacher.early_stop_p = 0.08
    c.collect.teacher.seed = 0
    c.collect.store_dir = ""              # "" = <workdir>/store
    c.collect.flush_every_tasks = 8       # task groups per committed shard pair
    c.collect.flush_every_s = 30.0
    c.collect.batch_window_s = 0.02       # how long a policy batch waits for more workers' steps
    c.collect.progress = True
    c.collect.record = ""                 # "har": each episode's traffic (bodies), storage and clock recorded into the
                                          # store's recordings/ (also for eval), replayable with eval.replay
    c.collect.viewer = False              # True: also write the trajectory viewer <workdir>/collect_viewer/index.html
                                          # (static HTML; copies every screenshot of the store)

    # Where the browsers run (rmsweb_jax/web/): collect, eval and their retry loop.
    c.web = ml_collections.ConfigDict()
    c.web.cdp_endpoint = ""               # comma-separated remote Chromiums driven over CDP (ws://host:port/devtools/
                                          # browser/<id>, or http://host:port to follow a restarted browser), spread
                                          # over collect.workers; "" = launch Debian's Chromium locally

    # Stage "eval": policies played closed loop, one attempt each, on seeds disjoint from the training store;
    # success (solved) with intervals, paired comparisons, cost, plots (rmsweb_jax/stages/eval.py). The suite,
    # judge, workers, time limits and viewport come from c.collect.
    c.eval = ml_collections.ConfigDict()
    c.eval.policies = "sft"               # comma-separated: sft | salvage (their hf exports) | teacher (the scripted
                                          # collector's attempt 1, a reference row) | hf:/path | flax:<model spec> |
                                          # http:<base_url>#<model>; each may be given a label: "<label>=<spec>"
    c.eval.tasks = ""                     # comma-separated task ids; "" = collect.tasks
    c.eval.first_seed = 100_000           # seeds first_seed .. first_seed + num_seeds - 1 per task: refused when a
    c.eval.num_seeds = 20                 # (task, seed) is in the training store (live suites: a task id)
    c.eval.max_steps = 15
    c.eval.max_new_tokens = 256
    c.eval.temperature = 0.0
    c.eval.training_store = ""            # "" = the collect store (collect.store_dir or <workdir>/store); "none" =
                                          # skip the seed check (a warning is printed)
    c.eval.compare = ""                   # "" = every policy against the first; or "a:b,c:d" by label
    c.eval.bootstrap_samples = 10_000
    c.eval.bootstrap_seed = 0
    c.eval.viewer = True                  # write the trajectory viewer <workdir>/eval/viewer/ over every policy
    c.eval.replay = ""                    # a store recorded with collect.record=har: replay its episodes offline
                                          # (its task groups, every request from the recordings; "" = play live)

    # The shared trainer (rmsweb_jax/train/): SFT and Salvage-DS stages read this block.
    c.train = ml_collections.ConfigDict()
    c.train.batch_size = 8                # global rows per step; divisible by microbatches x mesh data*fsdp
    c.train.microbatches = 1              # gradient accumulation: microbatches scanned per step
    c.train.loss_impl = "auto"            # auto | fused | chunked | reference | pallas | pallas_interpret (token log-probs)
    c.train.export_hf = True              # write <workdir>/<stage>/hf (to_hf) at the end
    c.train.optimizer = ml_collections.ConfigDict()
    c.train.optimizer.lr = 1e-5
    c.train.optimizer.warmup_steps = 10
    c.train.optimizer.total_steps = 100   # also the run's length
    c.train.optimizer.end_lr_fraction = 0.0
    c.train.optimizer.weight_decay = 0.0
    c.train.optimizer.b1 = 0.9
    c.train.optimizer.b2 = 0.999
    c.train.optimizer.eps = 1e-8
    c.train.optimizer.clip_norm = 1.0     # global-norm clipping; <= 0 disables
    c.train.checkpoint = ml_collections.ConfigDict()
    c.train.checkpoint.every_steps = 50
    c.train.checkpoint.keep = 3
    c.train.checkpoint.async_save = True
    c.train.metrics = ml_collections.ConfigDict()
    c.train.metrics.every_steps = 10
    c.train.metrics.peak_tflops = 0.0     # per device; 0 = known accelerator table, or measured on CPU
    c.train.metrics.wandb = ""            # a Weights & Biases project to log to as well ("" = none; the wandb extra)
    c.train.profile_steps = ""            # "START,STOP": a jax.profiler trace of those steps into <stage>/tensorboard

    # Stage "train_smoke": the trainer on deterministic synthetic batches (tests, demo).
    c.train_smoke = ml_collections.ConfigDict()
    c.train_smoke.examples = 8
    c.train_smoke.seq_len = 32
    c.train_smoke.seed = 0

    # The SFT data pipeline (stage "sft"; rmsweb_jax/data/sft.py): store -> prompts -> batches.
    c.data = ml_collections.ConfigDict()
    c.data.store_dir = ""                 # "" = <workdir>/store (what the collect stage wrote)
    c.data.mask = "thought_and_action"    # loss on the thought + tool call, or "action_only" (tool call)
    c.data.batching = "bucket"            # bucket: one example per row, padded to a bucket | pack: segment ids
    c.data.buckets = (2048, 4096, 8192)   # row lengths in tokens (pack: rows of the largest)
    c.data.bucket_patches = (4096, 8192, 16384)  # image patch rows per batch row, per bucket (x4 = merge^2 each)
    c.data.too_long = "error"             # an example no bucket holds: error | drop (counted, logged)
    c.data.seed = 0                       # shuffle seed; every epoch is reshuffled
    c.data.held_out_fraction = 0.0        # task groups (task id, seed) held out for action_accuracy
    c.data.split_seed = 0
    c.data.attempts = "all"               # successful attempts trained on: all | first (solved on attempt 1 only: what
                                          # a collector without retries would have kept); split.json records it
    c.data.worker_count = 0               # Grain worker processes (0 = in the training process)
    c.data.worker_buffer_size = 2         # batches each worker keeps ready
    c.data.read_threads = 1               # threads encoding examples in each process
    c.data.read_buffer_size = 8

    # Stage "action_accuracy": greedy per-step action accuracy of a policy on held-out steps, an offline proxy
    # (rmsweb_jax/stages/action_accuracy.py); closed-loop success in the browser is the eval stage's (c.eval).
    c.action_accuracy = ml_collections.ConfigDict()
    c.action_accuracy.mode = "steps"      # steps (the only mode; "closed_loop" is now the eval stage)
    c.action_accuracy.checkpoint = ""     # "" = hf:<workdir>/sft/hf (the sft stage's export); or hf:/path
    c.action_accuracy.max_examples = 0    # 0 = every held-out step
    c.action_accuracy.batch_size = 8      # prompts per generate call
    c.action_accuracy.max_new_tokens = 128

    # Stage "transfer" (the table runs it): SFT and Salvage-DS exports on Salvage-DS's training states (sampled, as
    # config.mine replays) and on sft's held-out task groups (greedy step accuracy; rmsweb_jax/stages/transfer.py).
    c.transfer = ml_collections.ConfigDict()
    c.transfer.held_out_steps = 0         # 0 = every held-out step (none unless data.held_out_fraction > 0)
    c.transfer.batch_size = 8             # prompts per greedy generate call
    c.transfer.max_new_tokens = 128

    # Stage "ground": grounding pretraining before SFT (rmsweb_jax/stages/ground.py, rows from
    # rmsweb_jax/data/grounding.py). For every listed element of every stored page of the training split (the
    # split config.data makes; no browser): an instruction naming the element -> the action at its centre, in the
    # agent's own prompt. Trains config.model.init with config.train, ground.train's values over it.
    c.ground = ml_collections.ConfigDict()
    c.ground.kinds = "click,type"         # rows per element: click (every uniquely named listed element) | type
                                          # (text inputs: type a word at its centre)
    c.ground.targets_per_row = 1          # targets of one page in one training row: the first in the agent's prompt,
                                          # each further one a short follow-up turn, so the page's element list is
                                          # read once for all of them (data/grounding.py GroundingExamples)
    c.ground.probe_rows = 160             # after training: greedy accuracy on this many grounding rows of held-out
                                          # pages (data.held_out_fraction's task groups; 0 = no probe)
    c.ground.probe_batch_size = 16        # prompts per greedy generate call
    c.ground.probe_max_new_tokens = 128
    c.ground.train = train_overrides()

    # Stage "base": the base policy's grounding pretraining on synthetic pages (rmsweb_jax/stages/base.py, pages from
    # rmsweb_jax/data/synthetic_pages.py): no store, no browser. Trains config.model.init with config.train,
    # base.train's values over it; probes greedy grounding on pages of another seed during and after training.
    c.base = ml_collections.ConfigDict()
    c.base.pages = 50_000                 # synthetic training pages (seed base.seed; a page is ~13 rows)
    c.base.seed = 1_000_000               # >= 1,000,000: far from every seed a MiniWoB++ task of the demo plays
    c.base.held_out_seed = 2_000_000      # the probe's pages: no training page
    c.base.min_elements = 4               # elements per page, drawn uniformly between the two
    c.base.max_elements = 24
    c.base.kinds = "click,type"
    c.base.targets_per_row = 6            # targets of one page in one training row (as config.ground's)
    c.base.probe_rows = 96                # greedy grounding rows of held-out pages per probe (0 = no probe)
    c.base.probe_every = 0                # probe every this many steps as well (0 = after training only)
    c.base.probe_batch_size = 16
    c.base.probe_max_new_tokens = 64
    c.base.train = train_overrides()

    # Stage "sft"'s starting point.
    c.sft = ml_collections.ConfigDict()
    c.sft.init = "model"                  # model = config.model.init | ground = the ground stage's export
                                          # (hf:<workdir>/ground/hf) | hf:/path
    c.sft.grounding_mix = 0.0             # grounding examples (the ground stage's rows, config.ground's kinds and
                                          # targets a row) mixed into SFT per training step; 0 = none

    # Stage "mine": the SFT policy's critical states on the sft training split (rmsweb_jax/mining/).
    c.mine = ml_collections.ConfigDict()
    c.mine.checkpoint = ""                # "" = hf:<workdir>/sft/hf (the sft stage's export); or hf:/path
    c.mine.samples = 8                    # K turns sampled per reference step
    c.mine.temperature = 1.0
    c.mine.top_p = 1.0
    c.mine.max_new_tokens = 256
    c.mine.tau = 0.5                      # critical: replay accuracy (share of K samples that are the reference
                                          # action) < tau; routine: >= tau
    c.mine.batch_states = 4               # states sampled together (x K conversations per sampler call)
    c.mine.max_batch = 8                  # the sampler's rows per generate call
    c.mine.seed = 0                       # sampling keys and the routine states kept
    c.mine.reference_logprob = True       # also log p(reference action | state), one forward pass per batch
    c.mine.skip_labels = "*"              # teacher labels whose steps are no reference: "*" = every labelled step
                                          # (the teacher's injected mistakes), or comma-separated labels ("" = none)
    c.mine.max_states = 0                 # replay a seeded draw of this many reference steps, stratified over
                                          # tasks (0 = all of the train split)
    c.mine.routine_share = 0.2            # routine states in the state set, as a share of it (0 = critical only)
    c.mine.uniform_states = 0             # > 0: the state set is a seeded draw of this many of all the training
                                          # split's reference steps (not capped by max_states), critical or not
                                          # (the table's rl_all_states ablation); 0 = mined
    c.mine.rollouts = False               # also run the policy on the training tasks and mine divergence points
    c.mine.repetition_window = 3          # an episode whose last k actions are identical is a repetition loop

    # Stage "salvage": Salvage-DS, group-relative RL on the mined critical states (rmsweb_jax/salvage/).
    c.salvage = ml_collections.ConfigDict()
    # salvage_ds (the paper's) | grpo (plain GRPO, the ablation "RL without Salvage-DS's pieces": binary reward,
    # no contrast / competence gate, no anchor; rmsweb_jax/salvage/learner.py)
    c.salvage.algorithm = "salvage_ds"
    c.salvage.init = ""                   # "" = hf:<workdir>/sft/hf (the sft stage's export); or hf:/path
    c.salvage.states = ""                 # "" = <workdir>/mine/states.arrayrecord (the mine stage's state set)
    c.salvage.seed = 0                    # state order (reshuffled every epoch) and sampling keys
    c.salvage.group_size = 8              # G responses sampled per state
    c.salvage.groups_per_step = 4         # B accepted groups per update
    c.salvage.max_draws_per_step = 16     # draw budget: states sampled per update at most (then the shortfall is logged)
    c.salvage.epochs = 1                  # optimizer steps on each drawn batch (PPO's epochs: from the second the
                                          # importance ratio leaves 1 and the clip bounds act); salvage.train.
                                          # total_steps counts optimizer steps and must be a multiple of it
    c.salvage.temperature = 1.0
    c.salvage.top_p = 1.0
    c.salvage.max_new_tokens = 256
    c.salvage.sample_batch = 8            # sampler rows per call (max(1, sample_batch // G) states, G rows each)
    c.salvage.reward = "polarized"        # polarized | graded | partial_credit (GUI-R1-style ablation baseline)
    c.salvage.graded = ml_collections.ConfigDict()  # graded: near-miss category -> reward in (-1, 0); others -1
    c.salvage.graded.wrong_element_same_role = -0.5
    c.salvage.graded.wrong_point = -0.5
    c.salvage.graded.wrong_text = -0.5
    c.salvage.graded.wrong_enter = -0.5
    c.salvage.graded.wrong_clear = -0.5
    c.salvage.partial_credit = ml_collections.ConfigDict()  # partial_credit: term weights (normalized by their sum)
    c.salvage.partial_credit.format = 0.2
    c.salvage.partial_credit.action_type = 0.2
    c.salvage.partial_credit.point = 0.3
    c.salvage.partial_credit.text = 0.3
    c.salvage.gates = "contrast_competence"  # none (plain GRPO) | contrast (DAPO-style filter) | contrast_competence
    c.salvage.contrast_std_min = 0.0      # contrast also needs the group's reward std above this
    # Share of correct samples a group needs. With G = 8 contrast alone already means 1/8..7/8 correct, so
    # [0.125, 0.875] would gate nothing; [0.25, 0.75] also rejects a lone lucky hit (one sample carrying a
    # +2.6-sigma advantage, often a coincidence on a critical state) and a lone slip on a nearly routine state.
    # Rejected groups still learn through the anchor.
    c.salvage.competence_min = 0.25
    c.salvage.competence_max = 0.75
    c.salvage.std_normalize = True        # advantages (r - mean) / (std + eps); False: r - mean
    c.salvage.anchor = "all"              # rejected groups anchored (NLL of the reference action): all | all_negative | off
    c.salvage.grounding_rows = 0          # up to this many of the ground stage's rows (training split's pages) as
                                          # anchor rows of each update, in the batch's rows the policy and anchor
                                          # rows leave (no extra compute); 0 = none (salvage/grounding_anchor.py)
    c.salvage.grounding_weight = 1.0      # their tool-call tokens' loss weight over the other anchor rows' (x the
                                          # anchor's loss.anchor_weight): 10 with anchor_weight 0.1 = SFT's NLL
    c.salvage.loss = ml_collections.ConfigDict()  # the update (rmsweb_jax/train/rl_loss.py RLLossSettings)
    c.salvage.loss.clip_low = 0.2         # ratio clipped to [1 - clip_low, 1 + clip_high] (PPO / DAPO)
    c.salvage.loss.clip_high = 0.28       # DAPO's clip-higher: more room to raise unlikely correct tokens
    c.salvage.loss.aggregation = "token_mean"  # token_mean | sequence_mean_token_mean
    c.salvage.loss.kl_beta = 0.0          # k3 KL to the frozen SFT policy; 0 = off (no reference forward pass)
    c.salvage.loss.anchor_weight = 0.1    # lambda: weight of the action-only anchor NLL on anchor rows
    # Salvage-DS's own values over config.train (which the sft stage reads). None (the one sentinel: 0 is a
    # real warmup_steps and end_lr_fraction) keeps config.train's value; a placeholder still takes its type's
    # value from the command line (--config.salvage.train.batch_size=48).
    c.salvage.train = ml_collections.ConfigDict()
    c.salvage.train.batch_size = placeholder(int)  # rows per update: >= B x G policy rows; the rest holds anchor rows
    c.salvage.train.total_steps = placeholder(int)  # updates (config.train.optimizer.total_steps)
    c.salvage.train.lr = placeholder(float)  # peak learning rate (config.train.optimizer.lr)
    c.salvage.train.warmup_steps = placeholder(int)  # (config.train.optimizer.warmup_steps)
    c.salvage.train.end_lr_fraction = placeholder(float)  # (config.train.optimizer.end_lr_fraction)
    return c


def get_config(arg=None):
    """Returns the defaults alone (`--config=configs/common.py`): what tests compare a run against."""
    return base_config()
