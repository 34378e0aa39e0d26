"""lab hosts: machines provisioned with `mqttbed lab provision`, named in specs

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'lab_hosts',
        sa.Column('name', sa.String(length=64), primary_key=True),
        sa.Column('destination', sa.String(length=300), nullable=False),
        sa.Column('ssh_port', sa.Integer(), nullable=True),
        sa.Column('key_filename', sa.Text(), nullable=True),
        sa.Column('known_hosts', sa.Text(), nullable=True),
        sa.Column('trust_new', sa.Boolean(), nullable=False),
        sa.Column('remote_dir', sa.Text(), nullable=False),
        sa.Column('extras', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('version', sa.String(length=64), nullable=True),
        sa.Column('facts', sa.JSON(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('provisioned_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('lab_hosts')
