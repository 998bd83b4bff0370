"""The API emulator with authentication and RBAC, as kube-apiserver enforces them.

`RbacEmulator` is `VersionedEmulator` (tests/kube_emulator.py) behind the API server's front
door:

* **Authentication** by bearer token: a known token is its user (a ServiceAccount's is
  `system:serviceaccount:<ns>:<name>` with the groups `system:serviceaccounts`,
  `system:serviceaccounts:<ns>`); every authenticated user is also in `system:authenticated`.
  An unknown token is 401 `Unauthorized`; no token is `system:anonymous`
  (`system:unauthenticated`), as with anonymous authentication on.
* **Request attributes** as kube-apiserver's RequestInfoFactory derives them: `/api/v1/...` and
  `/apis/<group>/<version>/...` are resource requests (namespace, resource, name, subresource;
  GET is get, list or, with `watch=true`, watch; POST create; PUT update; PATCH patch; DELETE
  delete or deletecollection; a list or watch with `fieldSelector=metadata.name=<n>` has the
  name `<n>`); anything else (`/apis/<group>/<version>` discovery included) is a non-resource
  request for its path.
* **Authorization** by RBAC (`RBAC`): the rules of the ClusterRoles bound by ClusterRoleBindings
  apply everywhere; the rules of a Role or ClusterRole bound by a RoleBinding only in that
  binding's namespace. A rule matches when its verbs, API groups and resources (`"*"`,
  `resource/subresource`, `*/subresource`) hold the request's, and its `resourceNames`, if any,
  hold the request's name (so never a create, nor a list or watch without the name's field
  selector); non-resource rules match a path exactly or by a trailing `*`. Otherwise 403
  `Forbidden`, with the API server's Status and wording. Kubernetes' default bindings that every
  authenticated user has (`system:discovery`, `system:basic-user`, `system:public-info-viewer`)
  are included; `system:masters` may do anything.
* **OwnerReferencesPermissionEnforcement** (kube-apiserver's `gc` admission plugin): a write that
  changes ownerReferences needs `delete` on the object (not for a create), and one that adds an
  ownerReference with `blockOwnerDeletion: true` needs `update` on the owner's `finalizers`
  subresource; else 403.
* **TokenReviews and SubjectAccessReviews** are answered from the same tokens and rules, so an
  RBAC binding is what lets a scraper in.

Every decision is recorded (`decisions`), so a test can say which rule each request needed and
replay the requests against a rule set with one rule less (`RBAC.without`).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock import Server

from tests.kube_emulator import (
    ApiError,
    Json,
    Key,
    VersionedEmulator,
    declare_backend_resources,
    declare_composite_resources,
    declare_scheduling_resources,
    declare_service_resources,
    declare_trainer_resources,
    serving,
)

AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
MASTERS = "system:masters"
TOKEN_REVIEWS = "post /apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "post /apis/authorization.k8s.io/v1/subjectaccessreviews"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""


def service_account(namespace: str, name: str) -> User:
    """The user a ServiceAccount's token authenticates as."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED),
        f"uid-{namespace}-{name}",
    )


@dataclass(frozen=True)
class Attributes:
    """What the authorizer judges (k8s.io/apiserver's authorizer.Attributes)."""

    user: User
    verb: str
    resource_request: bool
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    def __str__(self) -> str:
        if not self.resource_request:
            return f"{self.verb} {self.path}"
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        group = f".{self.api_group}" if self.api_group else ""
        where = f" in {self.namespace}" if self.namespace else ""
        named = f" {self.name!r}" if self.name else ""
        return f"{self.verb} {what}{group}{named}{where}"


@dataclass(frozen=True)
class Rule:
    """An RBAC PolicyRule."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    @classmethod
    def of(cls, rule: Json) -> Rule:
        def strings(key: str) -> tuple[str, ...]:
            values = rule.get(key) or []
            assert isinstance(values, list) and all(isinstance(v, str) for v in values), rule
            return tuple(values)

        return cls(
            strings("verbs"),
            strings("apiGroups"),
            strings("resources"),
            strings("resourceNames"),
            strings("nonResourceURLs"),
        )

    def matches(self, a: Attributes) -> bool:
        if not ("*" in self.verbs or a.verb in self.verbs):
            return False
        if not a.resource_request:
            return any(
                url == a.path or (url.endswith("*") and a.path.startswith(url[:-1]))
                for url in self.non_resource_urls
            )
        if not ("*" in self.api_groups or a.api_group in self.api_groups):
            return False
        combined = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        if not any(
            r == "*" or r == combined or (a.subresource and r == f"*/{a.subresource}")
            for r in self.resources
        ):
            return False
        # resourceNames limit a rule to named requests: a create, or a list without the
        # name's field selector, has no name and never matches.
        return not self.resource_names or (bool(a.name) and a.name in self.resource_names)


@dataclass(frozen=True)
class Grant:
    """A rule, where it applies (None: every namespace and the cluster scope) and whence."""

    rule: Rule
    namespace: str | None
    source: str  # e.g. "ClusterRole/x rules[2]"


@dataclass(frozen=True)
class Decision:
    attributes: Attributes
    allowed: bool
    by: str = ""  # the rule that allowed it (a Grant's source), or why it was refused


@dataclass(frozen=True)
class _Subject:
    kind: str
    name: str
    namespace: str = ""

    def holds(self, user: User) -> bool:
        if self.kind == "ServiceAccount":
            return user.name == f"system:serviceaccount:{self.namespace}:{self.name}"
        if self.kind == "User":
            return user.name == self.name
        return self.kind == "Group" and self.name in user.groups


# Kubernetes' default ClusterRoles every authenticated user is bound to (the parts a client of
# this service can meet) and the one for everybody.
_DEFAULTS: tuple[tuple[str, tuple[str, ...], Rule], ...] = (
    (
        "system:discovery",
        (AUTHENTICATED,),
        Rule(
            ("get",),
            non_resource_urls=(
                "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                "/openapi/*", "/readyz", "/version", "/version/",
            ),
        ),
    ),
    (
        "system:basic-user",
        (AUTHENTICATED,),
        Rule(
            ("create",),
            ("authorization.k8s.io",),
            ("selfsubjectaccessreviews", "selfsubjectrulesreviews"),
        ),
    ),
    (
        "system:public-info-viewer",
        (AUTHENTICATED, UNAUTHENTICATED),
        Rule(("get",), non_resource_urls=("/healthz", "/livez", "/readyz", "/version",
                                          "/version/")),
    ),
)  # fmt: skip


@dataclass
class RBAC:
    """The rules that apply to whom, from ClusterRoles, Roles and their bindings."""

    roles: dict[tuple[str, str, str], list[Rule]] = field(default_factory=dict)  # kind, ns, name
    bindings: list[tuple[str | None, tuple[str, str], list[_Subject]]] = field(
        default_factory=list
    )  # namespace (None: cluster-wide), roleRef (kind, name), subjects
    removed: frozenset[str] = frozenset()  # Grant sources left out (`without`)

    @classmethod
    def of(cls, objects: Iterable[Json]) -> RBAC:
        rbac = cls()
        for obj in objects:
            kind, meta = obj.get("kind"), obj.get("metadata") or {}
            if kind in ("ClusterRole", "Role"):
                ns = meta.get("namespace", "") if kind == "Role" else ""
                rules = [Rule.of(rule) for rule in obj.get("rules") or []]
                rbac.roles[(kind, ns, meta["name"])] = rules
            elif kind in ("ClusterRoleBinding", "RoleBinding"):
                ref = obj["roleRef"]
                assert ref["apiGroup"] == "rbac.authorization.k8s.io", ref
                subjects = [
                    _Subject(s["kind"], s["name"], s.get("namespace", ""))
                    for s in obj.get("subjects") or []
                ]
                where = meta["namespace"] if kind == "RoleBinding" else None
                rbac.bindings.append((where, (ref["kind"], ref["name"]), subjects))
        return rbac

    def without(self, source: str) -> RBAC:
        """The same rules less one (a Grant's source)."""
        return replace(self, removed=self.removed | {source})

    def sources(self, kind: str, namespace: str, name: str) -> list[str]:
        """The Grant sources of one role's rules, in order."""
        return [
            _source(kind, namespace, name, i)
            for i in range(len(self.roles.get((kind, namespace, name), [])))
        ]

    def grants(self, user: User) -> list[Grant]:
        found: list[Grant] = []
        for name, groups, rule in _DEFAULTS:
            if set(groups) & set(user.groups):
                found.append(Grant(rule, None, f"ClusterRole/{name} (default)"))
        for where, (kind, name), subjects in self.bindings:
            if not any(s.holds(user) for s in subjects):
                continue
            ns = (where or "") if kind == "Role" else ""
            for i, rule in enumerate(self.roles.get((kind, ns, name), [])):
                source = _source(kind, ns, name, i)
                if source not in self.removed:
                    found.append(Grant(rule, where, source))
        return found

    def decide(self, a: Attributes) -> Decision:
        if MASTERS in a.user.groups:
            return Decision(a, True, MASTERS)
        for grant in self.grants(a.user):
            # A RoleBinding's rules hold only inside its namespace (never at the cluster scope).
            if grant.namespace is not None and (
                not a.resource_request or a.namespace != grant.namespace
            ):
                continue
            if grant.rule.matches(a):
                return Decision(a, True, grant.source)
        return Decision(a, False, "no RBAC rule allows it")


def _source(kind: str, namespace: str, name: str, index: int) -> str:
    where = f"{namespace}/" if namespace else ""
    return f"{kind}/{where}{name} rules[{index}]"


def forbidden_message(a: Attributes) -> str:
    """kube-apiserver's words for an RBAC denial."""
    if not a.resource_request:
        return f'forbidden: User "{a.user.name}" cannot {a.verb} path "{a.path}"'
    what = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
    named = f' "{a.name}"' if a.name else ""
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    scope = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    return (
        f'{what}{named} is forbidden: User "{a.user.name}" cannot {a.verb} resource '
        f'"{resource}" in API group "{a.api_group}" {scope}'
    )


def _forbidden(a: Attributes, message: str | None = None) -> ApiError:
    details = {"name": a.name, "group": a.api_group, "kind": a.resource} if a.resource else None
    return ApiError(403, "Forbidden", message or forbidden_message(a), details)


# --- request attributes -------------------------------------------------------------------------


def attributes(user: User, method: str, path: str, params: dict[str, str]) -> Attributes:
    """kube-apiserver's RequestInfoFactory, for the paths this project's clients use."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return Attributes(user, method.lower(), False, path=path)  # the method's name, lowered
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    watching = params.get("watch", "").lower() in ("true", "1")
    if method in ("GET", "HEAD"):
        verb = "watch" if watching else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    if verb in ("list", "watch") and not name:
        terms = [t.strip() for t in (params.get("fieldSelector") or "").split(",") if t.strip()]
        if len(terms) == 1:
            for op in ("==", "="):
                key, sep, value = terms[0].partition(op)
                if sep and key.strip() == "metadata.name":
                    name = value.strip()
                    break
    return Attributes(user, verb, True, group, resource, subresource, namespace, name, path)


# --- the emulator -------------------------------------------------------------------------------

_CURRENT: contextvars.ContextVar[tuple[User, str] | None] = contextvars.ContextVar(
    "rbac_request", default=None
)


@attrs.define(kw_only=True)
class RbacEmulator(VersionedEmulator):
    """`VersionedEmulator` that authenticates by token and authorizes by `rbac` (see above)."""

    rbac: RBAC = attrs.field(factory=RBAC)
    tokens: dict[str, User] = attrs.field(factory=dict)
    decisions: list[Decision] = attrs.field(factory=list, init=False)

    def denials(self, user: str | None = None) -> list[Decision]:
        return [
            d
            for d in self.decisions
            if not d.allowed and (user is None or d.attributes.user.name == user)
        ]

    def seen(self, user: str) -> list[Attributes]:
        """Every attribute set judged for `user`, requests and reviews alike, in order."""
        return [d.attributes for d in self.decisions if d.attributes.user.name == user]

    def _decide(self, a: Attributes) -> Decision:
        decision = self.rbac.decide(a)
        self.decisions.append(decision)
        return decision

    def _authenticate(self, request: kmock.Request) -> User:
        header = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        if not header:
            return User(ANONYMOUS, (UNAUTHENTICATED,))
        scheme, _, token = header.partition(" ")
        user = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            user = self._authenticate(request)
            # The path as sent (`request.url` is resolved: its dot segments are gone).
            path = serving().path
            a = attributes(user, request.method.value, path, dict(request.params))
            if not self._decide(a).allowed:
                raise _forbidden(a)
        except ApiError as err:
            return await self._render_error(err)
        token = _CURRENT.set((user, request.method.value))
        try:
            return await super()._handle(request)
        finally:
            _CURRENT.reset(token)

    # --- OwnerReferencesPermissionEnforcement ---

    def _owner_resource(self, ref: Json) -> tuple[str, str]:
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        declared: dict[Any, Any] = dict(self.resources.items())  # kmock.resource -> ResourceInfo
        for resource, info in declared.items():
            if resource.group == group and getattr(info, "kind", None) == ref.get("kind"):
                return group, str(resource.plural)
        raise ApiError(422, "Invalid", f"no resource of kind {ref.get('kind')} in {group!r}")

    def _admit_owner_refs(self, key: Key, old: Json | None, new: Json) -> None:
        current = _CURRENT.get()
        if current is None:
            return  # the emulator's own garbage collector
        user, _ = current
        resource, namespace, name = key
        group, plural = str(resource.group or ""), str(resource.plural or "")
        old_refs = ((old or {}).get("metadata") or {}).get("ownerReferences") or []
        new_refs = (new.get("metadata") or {}).get("ownerReferences") or []
        if old_refs == new_refs:
            return
        base = Attributes(user, "delete", True, group, plural, "", namespace or "", name)
        if old is not None and not self._decide(base).allowed:
            why = (
                f"cannot set an ownerRef on a resource you can't delete: {forbidden_message(base)}"
            )
            raise _forbidden(base, why)
        blocking_before = {r.get("uid") for r in old_refs if r.get("blockOwnerDeletion")}
        for ref in new_refs:
            if not ref.get("blockOwnerDeletion") or ref.get("uid") in blocking_before:
                continue
            owner_group, owner_plural = self._owner_resource(ref)
            a = replace(base, verb="update", api_group=owner_group, resource=owner_plural,
                        subresource="finalizers", name=str(ref.get("name", "")))  # fmt: skip
            if not self._decide(a).allowed:
                why = (
                    f"{_meta_name(plural, name)} is forbidden: cannot set "
                    "blockOwnerDeletion if an ownerReference refers to a resource you can't set "
                    f"finalizers on: {forbidden_message(a)}"
                )
                raise _forbidden(a, why)

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        body = json.loads(request.body or b"{}")
        if isinstance(body, dict) and request.resource is not None:
            meta = body.get("metadata") or {}
            key = (request.resource, request.namespace or None, str(meta.get("name", "")))
            self._admit_owner_refs(key, None, body)
        return await super()._serve_create(request)

    async def _store(self, key: Key, stored: Json, new: Json) -> Json:
        self._admit_owner_refs(key, stored, new)  # every PUT and PATCH (apply too) ends here
        return await super()._store(key, stored, new)


def _meta_name(plural: str, name: str) -> str:
    return f'{plural} "{name}"'


# --- TokenReviews and SubjectAccessReviews -------------------------------------------------------


def install_reviews(k: RbacEmulator) -> None:
    """Answer TokenReviews from `k.tokens` and SubjectAccessReviews from `k.rbac` (the callers
    themselves went through RBAC in `_handle`: they need `create` on the review kinds)."""

    async def token_review(request: kmock.Request) -> Json:
        body: Json = copy.deepcopy(request.data)
        spec = body.get("spec") or {}
        user = k.tokens.get(str(spec.get("token", "")))
        if user is None:
            status: Json = {"authenticated": False, "error": "invalid bearer token"}
        else:
            status = {
                "authenticated": True,
                "user": {"username": user.name, "uid": user.uid, "groups": list(user.groups)},
                "audiences": spec.get("audiences") or ["https://kubernetes.default.svc"],
            }
        return {**body, "status": status}

    async def access_review(request: kmock.Request) -> Json:
        body: Json = copy.deepcopy(request.data)
        spec = body.get("spec") or {}
        user = User(str(spec.get("user", "")), tuple(spec.get("groups") or ()), spec.get("uid", ""))
        non_resource = spec.get("nonResourceAttributes")
        if non_resource is not None:
            a = Attributes(
                user, non_resource.get("verb", ""), False, path=non_resource.get("path", "")
            )
        else:
            r = spec.get("resourceAttributes") or {}
            a = Attributes(
                user, r.get("verb", ""), True, r.get("group", ""), r.get("resource", ""),
                r.get("subresource", ""), r.get("namespace", ""), r.get("name", ""),
            )  # fmt: skip
        decision = k._decide(a)
        status: Json = {"allowed": decision.allowed}
        if decision.allowed:
            status["reason"] = f"RBAC: allowed by {decision.by}"
        return {**body, "status": status}

    k[TOKEN_REVIEWS] << token_review
    k[ACCESS_REVIEWS] << access_review


@contextlib.asynccontextmanager
async def rbac_emulator(
    rbac: RBAC, tokens: dict[str, User], admin_token: str
) -> AsyncIterator[tuple[RbacEmulator, str]]:
    """An `RbacEmulator` on a port and its URL, serving what `emulator(composites=True)` serves
    (CompositePodGroups too) and every other gang backend's CRDs; its own test
    client (`k.post(...)` and the helpers of tests/kube_emulator.py) sends `admin_token`,
    a `system:masters` user's."""
    tokens = {**tokens, admin_token: User("admin", (MASTERS, AUTHENTICATED))}
    async with RbacEmulator(rbac=rbac, tokens=tokens) as k, Server(k) as server:
        declare_trainer_resources(k)
        declare_service_resources(k)
        declare_scheduling_resources(k)
        declare_composite_resources(k)
        declare_backend_resources(k, ("coscheduling", "volcano", "kai"))
        install_reviews(k)
        server.client.headers["Authorization"] = f"Bearer {admin_token}"
        yield k, str(server.url).rstrip("/")
