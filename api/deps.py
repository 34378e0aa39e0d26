"""Dependencies of the API routes: the controller, and who is calling."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from mqttbed.controller.agent_api import client_address
from mqttbed.controller.controller import Controller
from mqttbed.controller.tokens import TokenRole
from mqttbed.controller.worker import CampaignWorker

TOKEN_COOKIE = "mqttbed_token"


def get_controller(request: Request) -> Controller:
    """The app's controller (``controller`` in the routes' parameters)."""
    return request.app.state.controller


def get_worker(request: Request) -> CampaignWorker:
    return request.app.state.worker


ControllerDep = Annotated[Controller, Depends(get_controller)]
WorkerDep = Annotated[CampaignWorker, Depends(get_worker)]


def presented_token(request: Request) -> str:
    """The token of the request: a bearer header (scripts) or the login cookie (browsers)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token:
        return token
    return request.cookies.get(TOKEN_COOKIE, "")


def require_user(request: Request, controller: ControllerDep) -> None:
    """401 without a valid token, 403 for an agent token: these routes are for users."""
    caller = controller.authenticate(presented_token(request), client_address(request))
    role = caller.role
    if role is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            f"a user token is required ({caller.problem})" if caller.problem
                            else "a user token is required",
                            headers={"WWW-Authenticate": "Bearer"})
    if role != TokenRole.USER:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"{role} tokens cannot use this route; it needs a user token")


UserDep = Depends(require_user)
