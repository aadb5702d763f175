"""What an SD method and a per-step policy *are*, defined once: every other module dispatches through here.

Two tables:

* :data:`METHODS`: the speculative-decoding methods a sweep config names (``methods.*.name``), as data: the
  value vLLM's ``speculative_config["method"]`` takes, what kind of drafter model the method needs, which
  acceptance list of a trace a replay on its path reads, which engine-cost path it runs on, whether vLLM 0.26's
  runner pads every row to K, where our trained drafter lives, and its place in plots.
* :data:`POLICIES`: the per-step policies the simulator walks and the engine replays (fixed k, the oracles,
  the online policy, the shipped baselines, the calibration plans), each with the engine methods it can be
  replayed on and one ``build`` function that returns its per-step plans. Policy modules register their
  specs with :func:`register_policy` when they are imported; ``import sdlib.sim.policy`` imports them all.

A policy *instance* is a :class:`PolicyRef`: a spec name, optionally the drafter it runs with and an integer
k. Its label (``fixed-eagle3-k3``, ``oracle-ngram``, ``online``) is made from those fields by
:meth:`PolicyRef.label` and is never parsed back: :func:`resolve_policy` looks a label up among the
instances the registered specs enumerate.

This module imports nothing from sdlib (it is the bottom of the import graph).

Usage:
    from sdlib.core.registry import method_spec, resolve_policy
    method_spec("eagle3").path                       # 'padded'
    import sdlib.sim.policy                          # registers the policies
    resolve_policy("fixed-eagle3-k3")                # PolicyRef(name='fixed', drafter='eagle3', k=3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

#: The drafters whose acceptance the traces record (keys of ``PreparedTraces.acc``).
DRAFTERS = ("ngram", "eagle3")
#: The longest draft the traces can score (the authors' traces record k = 20 and cap acc at 21).
KMAX = 20
#: The paper's ``prompt_lookup_min`` / ``prompt_lookup_max``: sdlib's defaults for method ngram, and the one
#: n-gram look-up rule's (:mod:`sdlib.extract.ngram`).
NGRAM_MIN, NGRAM_MAX = 3, 7


class RegistryError(ValueError):
    """An unknown method or policy name; the message is one line listing the known ones."""


# --------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class MethodSpec:
    """One SD method of a sweep config (``methods.*.name``).

    ``model``: what ``methods.*.model`` must be: ``None`` (takes none), ``"head"`` (an EAGLE head),
    ``"eagle3_head"`` (an EAGLE-3 head), ``"draft"`` (a full draft model), ``"class"`` (a proposer class
    ``pkg.module.Class``), ``"optional"`` (vLLM finds it in the target, e.g. MTP layers).
    ``trace``: the acceptance list (:data:`DRAFTERS`) a trace replay on this method's engine path reads;
    None: the method cannot stand for a replay. ``path``: the engine-cost path (``none``, ``padded``,
    ``ragged``; :mod:`sdlib.sim.engine_costs`); None: not fitted. ``padded``: vLLM 0.26's runner verifies K
    draft slots for every row whatever was drafted (V2 runner: EAGLE, EAGLE-3), so a replay pads shorter
    drafts with rejected ones. ``trained``: our trained drafter's folder under ``data/models``. ``defaults``:
    ``speculative_config`` entries sdlib sets unless a config's ``options`` do. ``drafts_k``: the drafter
    proposes k tokens at every verify step (False: a look-up that proposes what it matches; None: unknown, a
    user's proposer, confirmed from vLLM's counters). ``sdlib_options``: ``options`` entries sdlib itself acts on
    (:data:`SDLIB_OPTIONS`), never passed to vLLM's ``speculative_config``.
    """

    name: str
    vllm_method: Optional[str]
    title: str
    model: Optional[str] = None
    trace: Optional[str] = None
    path: Optional[str] = None
    padded: bool = False
    trained: Optional[str] = None
    order: int = 99
    defaults: tuple = ()
    drafts_k: Optional[bool] = True
    sdlib_options: tuple = ()

    @property
    def is_sd(self) -> bool:
        return self.vllm_method is not None

    @property
    def needs_model(self) -> bool:
        return self.model in ("head", "eagle3_head", "draft", "class")

    @property
    def takes_model(self) -> bool:
        return self.model is not None

    @property
    def is_head(self) -> bool:
        """An EAGLE-style head (shares the target's hidden states)."""
        return self.model in ("head", "eagle3_head")

    @property
    def head_kind(self) -> Optional[str]:
        """``eagle`` / ``eagle3`` for an EAGLE-style head (how its parameters are counted), else None."""
        return {"head": "eagle", "eagle3_head": "eagle3"}.get(self.model)

    @property
    def model_drafter(self) -> bool:
        """Drafts with a model of its own (draft model or head): k drafts every verify step."""
        return self.model in ("head", "eagle3_head", "draft")


_METHOD_LIST = (
    MethodSpec("none", None, "no SD", path="none", order=0),
    MethodSpec("ngram", "ngram", "n-gram", trace="ngram", path="ragged", order=1, drafts_k=False,
               defaults=(("prompt_lookup_min", NGRAM_MIN), ("prompt_lookup_max", NGRAM_MAX))),
    MethodSpec("draft_model", "draft_model", "draft model", model="draft", trace="eagle3", trained="draft", order=2),
    MethodSpec("eagle", "eagle", "EAGLE", model="head", trace="eagle3", path="padded", padded=True, trained="eagle",
               order=3),
    MethodSpec("eagle3", "eagle3", "EAGLE-3", model="eagle3_head", trace="eagle3", path="padded", padded=True,
               trained="eagle3", order=4, sdlib_options=("confidence_stop",)),
    MethodSpec("mtp", "mtp", "MTP", model="optional", order=5),
    MethodSpec("custom", "custom_class", "custom proposer", model="class", order=6, drafts_k=None),
)
#: Method options sdlib acts on itself (a method takes those its spec's ``sdlib_options`` list), with what they
#: mean. ``confidence_stop``: SpecDec++'s stop threshold h on vLLM's own drafter (:mod:`sdlib.vllm.confidence_stop`).
SDLIB_OPTIONS = {
    "confidence_stop": "SpecDec++ threshold h, 0 < h <= 1: each row keeps drafts 1..j, j the first with "
                       "1 - p_1...p_j > h (p: the head's top-1 probabilities; at least 1, at most k; 1 never stops)",
}
#: Every SD method by name, in plot order.
METHODS: dict[str, MethodSpec] = {m.name: m for m in _METHOD_LIST}


def method_spec(name: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``name``; :class:`RegistryError` naming the known ones otherwise."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise RegistryError(f"unknown SD method {name!r} (one of {', '.join(METHODS)})") from None


def method_names(where: Optional[Callable[[MethodSpec], bool]] = None) -> tuple[str, ...]:
    """Method names in plot order, optionally only those where ``where(spec)`` holds."""
    return tuple(m.name for m in METHODS.values() if where is None or where(m))


def method_order(name: str) -> int:
    """A method's place in plots (unknown names last)."""
    return METHODS[name].order if name in METHODS else len(METHODS)


def engine_label(name: str, k: int) -> str:
    """The name of an engine: ``none`` without SD, else ``<method>-k<k>``."""
    return "none" if not method_spec(name).is_sd else f"{name}-k{k}"


# --------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class PolicyRef:
    """One policy instance: a registered spec's name, the drafter it runs with (None: the spec's own choice)
    and an integer k (None: none). The label is made from these, never read back."""

    name: str
    drafter: Optional[str] = None
    k: Optional[int] = None

    @property
    def label(self) -> str:
        parts = [self.name] + ([self.drafter] if self.drafter else []) + ([f"k{self.k}"] if self.k is not None else [])
        return "-".join(parts)

    @property
    def spec(self) -> "PolicySpec":
        return policy_spec(self.name)

    def __str__(self) -> str:
        return self.label


@dataclass
class BuildRequest:
    """What a policy's ``build`` gets: the requests' flat inputs (``sdlib.sim.walk.PolicyInputs``), one
    (cost model, batch size) per configuration to return steps for, the engine's ``K`` (every proposal is capped
    at it; None in pure simulation: the traces' kmax), the engine ``method`` a replay runs on (None in
    simulation), and shared resources: ``predictor`` (the online policies'; None: cross-fitted on the inputs),
    ``resources`` (anything else a builder needs, by name)."""

    inputs: Any
    configs: list
    K: Optional[int] = None
    method: Optional[str] = None
    predictor: Any = None
    resources: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PolicySpec:
    """A per-step policy.

    ``family``: ``fixed``, ``oracle``, ``combine``, ``online``, ``baseline`` or ``calibration`` (tables group by
    it). ``drafters``: the drafters an instance may name (``None`` in the tuple = the spec's own drafter
    choice, no drafter in the label). ``ks``: the k an instance may take (empty: none; ``None`` in the tuple: k
    is optional); ``family_ks`` the ones its group expands to. ``replays_on``: engine methods a replay of it can
    run on (empty: simulation only); ``replay_drafter``: in a replay, the instance's drafter is the method's
    trace list; ``replay_k``: in a replay, the instance's k is the engine's K. ``mixes_drafters``: both
    drafters run in one step (the engine runs vLLM's n-gram look-up beside EAGLE-3). ``batch_dependent``: its
    steps depend on the batch size. ``needs``: inputs beyond the traces: ``predictor``, ``confidences``,
    ``engine_files`` (its replay plans are decided from committed files, which a cell's key hashes).
    ``simulate``: part of ``sdlib simulate``; ``groups``: the names of :data:`GROUPS` that expand to its
    instances. ``build(request, ref) -> [PolicySteps per configuration]``. ``source``: where the rule comes
    from.
    """

    name: str
    family: str
    build: Callable[[BuildRequest, PolicyRef], list]
    source: str
    drafters: tuple = (None,)
    ks: tuple = ()
    family_ks: tuple = ()
    replays_on: tuple = ()
    replay_drafter: bool = False
    replay_k: bool = False
    mixes_drafters: bool = False
    batch_dependent: bool = False
    needs: frozenset = frozenset()
    simulate: bool = True
    groups: tuple = ()

    def refs(self, ks: Optional[Iterable[int]] = None) -> list[PolicyRef]:
        """The instances of this spec (every drafter; k in ``ks``, default :attr:`ks`)."""
        kk = tuple(self.ks if ks is None else ks) if self.ks else (None,)
        return [PolicyRef(self.name, d, k) for d in self.drafters for k in kk]

    def plain_refs(self) -> list[PolicyRef]:
        """The instances without a k (what the spec's name stands for); empty when k is required."""
        return [r for r in self.refs() if r.k is None]

    def mixes(self, ref: PolicyRef) -> bool:
        """Does ``ref`` run both drafters? (a spec that mixes them mixes only with its own drafter choice)"""
        return self.mixes_drafters and ref.drafter is None


#: Registered policies, in registration order.
POLICIES: dict[str, PolicySpec] = {}
#: The ``family`` column of the policy tables.
FAMILIES = ("fixed", "oracle", "combine", "online", "baseline")
#: Group names ``sdlib simulate --policies`` accepts beside policy names: each expands to the instances of the
#: specs that list it in :attr:`PolicySpec.groups` (in registration order).
GROUPS = ("fixed", "oracle", "online-ablations", "baselines")


def register_policy(spec: PolicySpec) -> PolicySpec:
    """Add ``spec`` to :data:`POLICIES` (a second spec of one name is an error)."""
    if spec.name in POLICIES and POLICIES[spec.name] is not spec:
        raise RegistryError(f"policy {spec.name!r} is registered twice")
    if spec.family not in FAMILIES + ("calibration",):
        raise RegistryError(f"policy {spec.name!r}: family {spec.family!r} is not one of {FAMILIES}")
    if set(spec.groups) - set(GROUPS):
        raise RegistryError(f"policy {spec.name!r}: groups {sorted(set(spec.groups) - set(GROUPS))} not in {GROUPS}")
    for m in spec.replays_on:
        method_spec(m)
    POLICIES[spec.name] = spec
    _LABELS.clear()
    return spec


def policy_spec(name: str) -> PolicySpec:
    """The registered :class:`PolicySpec` of ``name``."""
    try:
        return POLICIES[name]
    except KeyError:
        raise RegistryError(f"unknown policy {name!r} (one of {', '.join(POLICIES) or 'none registered'})") from None


_LABELS: dict[str, PolicyRef] = {}


def policy_labels() -> dict[str, PolicyRef]:
    """Every instance label of every registered spec -> its :class:`PolicyRef` (k over all :attr:`ks`)."""
    if not _LABELS:
        for spec in POLICIES.values():
            for ref in spec.refs():
                _LABELS.setdefault(ref.label, ref)
    return _LABELS


def resolve_policy(text: str) -> PolicyRef:
    """The instance whose label is ``text``; :class:`RegistryError` otherwise."""
    ref = policy_labels().get(text)
    if ref is None:
        raise RegistryError(f"unknown policy {text!r}: groups {list(GROUPS)}, policies "
                            f"{[s.name for s in POLICIES.values() if s.simulate]} "
                            "(fixed and oracle take a drafter: fixed-eagle3-k3, oracle-ngram)")
    return ref


def expand_policies(names: Iterable[str], kmax: int = KMAX) -> list[PolicyRef]:
    """Group names (:data:`GROUPS`), spec names and instance labels -> instances (each once, in order); a group
    expands to its specs' instances with k in ``family_ks`` up to ``kmax``. Unknown names raise
    :class:`RegistryError`."""
    out: list[PolicyRef] = []
    for n in names:
        if n in GROUPS:
            for spec in POLICIES.values():
                if n in spec.groups:
                    out += spec.refs([k for k in spec.family_ks if k <= kmax] if spec.ks else None)
        elif n in POLICIES and POLICIES[n].plain_refs():
            out += POLICIES[n].plain_refs()
        else:
            out.append(resolve_policy(n))
    return list(dict.fromkeys(out))


def simulated_names() -> list[str]:
    """Groups, then the spec names ``sdlib simulate`` knows (for help texts)."""
    return list(GROUPS) + [s.name for s in POLICIES.values() if s.simulate]


def replay_ref(policy: str, method: str, K: int) -> PolicyRef:
    """The instance a trace replay of ``policy`` (a config's ``methods.*.replay``) stands for on ``method``'s
    engine with ``num_speculative_tokens = K``: a spec name that takes the method's drafter gets the method's
    trace list, one that takes k gets K; a label is its instance (``online-ngram``; ``fixed-ngram-k3`` on a
    K = 10 engine: k = 3 drafted where the engine could take 10, its drafter must be the method's trace list)."""
    spec = POLICIES.get(policy)
    named = spec is not None
    ref = PolicyRef(policy) if named else resolve_policy(policy)
    spec = ref.spec
    if not spec.replays_on:
        raise RegistryError(f"replay: {policy!r} is a simulation-only policy (replayable: "
                            f"{', '.join(replay_names())})")
    if method not in spec.replays_on:
        raise RegistryError(f"replay: {policy!r} replays on methods {list(spec.replays_on)}, not on method {method!r}")
    trace = method_spec(method).trace
    if named:
        return PolicyRef(spec.name, trace if spec.replay_drafter else ref.drafter, K if spec.replay_k else ref.k)
    if spec.replay_drafter and ref.drafter != trace:
        raise RegistryError(f"replay: {policy!r} drafts with {ref.drafter}, but method {method!r} replays the "
                            f"{trace} lists")
    if ref.k is not None and ref.k > K:
        raise RegistryError(f"replay: {policy!r} drafts {ref.k} tokens, more than the engine's K = {K}")
    return ref


def replay_names() -> list[str]:
    """What a config's ``methods.*.replay`` may name: replayable spec names, the labels of replayable instances
    with a drafter of their own (``online-ngram``), and the labels of instances with a k of their own
    (``fixed-ngram-k3``: k below an engine's K)."""
    out = []
    for spec in POLICIES.values():
        if not spec.replays_on:
            continue
        out.append(spec.name)
        if not spec.replay_drafter:  # instances with a drafter of their own
            out += [r.label for r in spec.refs() if r.drafter is not None and r.k is None]
        if spec.replay_k:  # instances with a k of their own
            out += [r.label for r in spec.refs() if r.k is not None]
    return list(dict.fromkeys(out))


def policies_needing(what: str) -> tuple[str, ...]:
    """Names of the specs whose :attr:`PolicySpec.needs` holds ``what``."""
    return tuple(s.name for s in POLICIES.values() if what in s.needs)
