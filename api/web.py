"""Server-rendered pages: log in, the campaign list, a campaign's report, simulations."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from mqttbed.api.compare_page import NotComparable, comparison_of, render_comparison
from mqttbed.api.deps import TOKEN_COOKIE, ControllerDep, presented_token
from mqttbed.api.report import plotly_js_path, render_report, templates
from mqttbed.api.simulations import SeedQuery, UnitsQuery, cloud_edge_result, render_cloud_edge
from mqttbed.controller.agent_api import client_address
from mqttbed.controller.tokens import TokenRole

router = APIRouter(include_in_schema=False)


def _user_or_login(request: Request, controller: ControllerDep) -> Response | None:
    """None for a user; else a redirect to the login page (or 403 for an agent token)."""
    role = controller.authenticate(presented_token(request), client_address(request)).role
    if role == TokenRole.USER:
        return None
    if role is not None:
        raise HTTPException(403, f"{role} tokens cannot see the web pages")
    return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)


@router.get("/login")
def login_form(next: str = "/") -> HTMLResponse:
    return HTMLResponse(templates().get_template("login.html").render(
        next=next, error=None, standalone=False))


@router.post("/login")
def login(request: Request, controller: ControllerDep, token: Annotated[str, Form()],
          next: Annotated[str, Form()] = "/") -> Response:
    if controller.authenticate(token, client_address(request)).role != TokenRole.USER:
        page = templates().get_template("login.html").render(
            next=next, error="That is not a valid user token.", standalone=False)
        return HTMLResponse(page, status_code=401)
    target = next if next.startswith("/") and not next.startswith("//") else "/"
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return response


@router.get("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(TOKEN_COOKIE)
    return response


@router.get("/")
def index(request: Request, controller: ControllerDep) -> Response:
    if (redirect := _user_or_login(request, controller)) is not None:
        return redirect
    return HTMLResponse(templates().get_template("index.html").render(standalone=False))


@router.get("/campaigns/{campaign_id}")
def report_page(campaign_id: str, request: Request, controller: ControllerDep) -> Response:
    if (redirect := _user_or_login(request, controller)) is not None:
        return redirect
    try:
        return HTMLResponse(render_report(controller, campaign_id, standalone=False))
    except KeyError:
        raise HTTPException(404, f"no campaign {campaign_id!r}") from None


@router.get("/compare")
def compare_page(ids: str, request: Request, controller: ControllerDep) -> Response:
    """Two campaigns side by side: ``/compare?ids=ID1,ID2``."""
    if (redirect := _user_or_login(request, controller)) is not None:
        return redirect
    wanted = [i.strip() for i in ids.split(",") if i.strip()]
    if len(wanted) != 2:
        raise HTTPException(422, f"ids must name two campaigns, as ids=ID1,ID2; got {ids!r}")
    try:
        comparison = comparison_of(controller.layout, *wanted)
    except NotComparable as exc:
        raise HTTPException(404, str(exc)) from None
    return HTMLResponse(render_comparison(comparison, standalone=False))


@router.get("/simulations/cloud-edge")
def cloud_edge_page(request: Request, controller: ControllerDep, seed: SeedQuery = 0,
                    units: UnitsQuery = 5000) -> Response:
    """The cloud-edge paper's policy simulation: Figs. 8 and 9 beside the paper's."""
    if (redirect := _user_or_login(request, controller)) is not None:
        return redirect
    return HTMLResponse(render_cloud_edge(cloud_edge_result(seed, units)))


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(plotly_js_path(), media_type="text/javascript")
