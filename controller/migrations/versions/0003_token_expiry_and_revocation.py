"""token expiry and revocation

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Tokens created before this revision never expire and are not revoked (both NULL).
    with op.batch_alter_table('tokens') as batch:
        batch.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tokens') as batch:
        batch.drop_column('revoked_at')
        batch.drop_column('expires_at')
