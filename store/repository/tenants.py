"""Tenants and their API keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store import keys
from store.errors import Conflict
from store.ids import new_id
from store.models import ACTIVE_STATUSES, ApiKey, File, Job, Tenant, utcnow

KEY_TOUCH_INTERVAL = timedelta(seconds=60)


def create_tenant(session: Session, name: str) -> Tenant:
    if session.scalar(sa.select(Tenant.id).where(Tenant.name == name)) is not None:
        raise Conflict(f"a tenant named {name!r} already exists", param="name", code="tenant_exists")
    tenant = Tenant(id=new_id("ten"), name=name, created_at=utcnow())
    session.add(tenant)
    session.flush()
    return tenant


def get_tenant(session: Session, tenant_id: str) -> Tenant | None:
    return session.get(Tenant, tenant_id)


def get_tenant_by_name(session: Session, name: str) -> Tenant | None:
    return session.scalar(sa.select(Tenant).where(Tenant.name == name))


@dataclass(frozen=True)
class TenantUsage:
    active_jobs: int
    jobs: int
    files: int
    file_bytes: int


def tenant_usage(session: Session, tenant_id: str) -> TenantUsage:
    jobs, active = session.execute(
        sa.select(sa.func.count(Job.id), sa.func.count(Job.id).filter(Job.status.in_(ACTIVE_STATUSES))).where(
            Job.tenant_id == tenant_id
        )
    ).one()
    files, file_bytes = session.execute(
        sa.select(sa.func.count(File.id), sa.func.coalesce(sa.func.sum(File.bytes), 0)).where(
            File.tenant_id == tenant_id
        )
    ).one()
    return TenantUsage(active_jobs=active, jobs=jobs, files=files, file_bytes=int(file_bytes))


def create_api_key(session: Session, tenant_id: str, name: str, *, max_active: int = 0) -> tuple[ApiKey, str]:
    """A new key for the tenant; returns the row and the secret (shown once, never stored). With `max_active`
    (> 0), a tenant that already has that many active keys gets a Conflict (too_many_api_keys); the tenant's
    row is locked while counting (PostgreSQL), so concurrent requests cannot pass the cap together."""
    if max_active > 0:
        session.execute(sa.select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
        active = session.scalar(
            sa.select(sa.func.count(ApiKey.id)).where(
                ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None)
            )
        )
        if (active or 0) >= max_active:
            raise Conflict(
                f"the tenant has {active} active API keys, the most allowed (max_active_keys_per_tenant = "
                f"{max_active}); revoke one before creating another",
                code="too_many_api_keys",
            )
    secret = keys.generate_key()
    row = ApiKey(
        id=new_id("key"),
        tenant_id=tenant_id,
        name=name,
        prefix=keys.key_prefix(secret),
        key_hash=keys.hash_key(secret),
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row, secret


def find_api_key(session: Session, presented: str) -> tuple[ApiKey, Tenant] | None:
    """The key row (revoked or not) and its tenant when `presented` is a real key, else None."""
    if not keys.looks_like_key(presented):
        return None
    found = session.execute(
        sa.select(ApiKey, Tenant)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.prefix == keys.key_prefix(presented))
    ).one_or_none()
    if found is None or not keys.key_matches(presented, found[0].key_hash):
        return None
    return found[0], found[1]


def touch_api_key(session: Session, key: ApiKey, now: datetime | None = None) -> bool:
    """Record use at most once a minute per key (no write on most requests). True when it wrote."""
    now = now or utcnow()
    if key.last_used_at is not None and now - key.last_used_at < KEY_TOUCH_INTERVAL:
        return False
    session.execute(
        sa.update(ApiKey)
        .where(ApiKey.id == key.id)
        .values(last_used_at=now)
        .execution_options(synchronize_session=False)
    )
    key.last_used_at = now
    return True


def list_api_keys(session: Session, tenant_id: str) -> list[ApiKey]:
    return list(session.scalars(sa.select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id)))


def get_api_key(session: Session, tenant_id: str, key_id: str) -> ApiKey | None:
    return session.scalar(sa.select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id))


def revoke_api_key(session: Session, key: ApiKey) -> ApiKey:
    """Revoke; refuses the tenant's last active key (409), which would lock the tenant out."""
    if key.revoked_at is not None:
        return key
    others = session.scalar(
        sa.select(sa.func.count(ApiKey.id)).where(
            ApiKey.tenant_id == key.tenant_id, ApiKey.revoked_at.is_(None), ApiKey.id != key.id
        )
    )
    if not others:
        raise Conflict(
            "this is the tenant's last active key; create another key before revoking it",
            code="last_active_key",
        )
    key.revoked_at = utcnow()
    session.flush()
    return key
