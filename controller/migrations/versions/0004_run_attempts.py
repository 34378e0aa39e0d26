"""run attempts: a run interrupted by its controller is retried as a new attempt

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Runs stored before this revision are each their first attempt.
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('attempt', sa.Integer(), nullable=False,
                                   server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('attempt')
