"""The web environment: Playwright browser workers, observations, actions, and the worker pool."""
from rmsweb_jax.web.action_text import ParsedAction, ParseError, format_action, parse_action
from rmsweb_jax.web.actions import RELATIVE, Action, ActionError, CoordinateSpace, SemanticTarget
from rmsweb_jax.web.elements import BBox, Element, element_at, same_element
from rmsweb_jax.web.episode import Episode, EpisodeRequest, History
from rmsweb_jax.web.loop_thread import LoopThread
from rmsweb_jax.web.observation import Observation
from rmsweb_jax.web.pool import AsyncWorkerPool
from rmsweb_jax.web.safety import RequestPolicy
from rmsweb_jax.web.semantics import resolve_on, resolve_target, same_action
from rmsweb_jax.web.suite import EpisodeStatus, Suite
from rmsweb_jax.web.sync_pool import WorkerPool
from rmsweb_jax.web.worker import BrowserWorker, EpisodeNotRunning, WorkerConfig, WorkerFault

__all__ = [
    "RELATIVE", "Action", "ActionError", "AsyncWorkerPool", "BBox", "BrowserWorker", "CoordinateSpace", "Element",
    "Episode", "EpisodeNotRunning", "EpisodeRequest", "EpisodeStatus", "History", "LoopThread", "Observation", "ParseError",
    "ParsedAction", "RequestPolicy", "SemanticTarget", "Suite", "WorkerConfig", "WorkerFault", "WorkerPool",
    "element_at", "format_action", "parse_action", "resolve_on", "resolve_target", "same_action", "same_element",
]
