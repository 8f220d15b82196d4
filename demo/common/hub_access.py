"""Whose Hugging Face token a visitor's request to the Hub carries.

On a Space (SPACE_ID set) the server is the owner's and its visitors are strangers: each acts on the Hub as
themselves, with the token of their own "Sign in with Hugging Face" (gradio's OAuth: `gr.LoginButton`, a
`gr.OAuthToken` argument, the README's `hf_oauth: true`), or with none. The server's own token (HF_TOKEN, a cached
login) is never used for a visitor's request there: huggingface_hub's `token=False` sends no Authorization header at
all, where `token=None` would fall back to the server's. Locally (no SPACE_ID) the app has one user, whoever runs it,
and the machine's login is theirs, as the command line uses it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the annotation only: settings imports this module before the server imports gradio
    import gradio as gr

ANONYMOUS = False
"""huggingface_hub's token argument for "send no token" (None would mean "this machine's login")."""


def on_space() -> bool:
    """Whether the app serves a Hugging Face Space (Spaces set SPACE_ID)."""
    return bool(os.environ.get("SPACE_ID"))


def sign_in_offered() -> bool:
    """Whether the page offers "Sign in with Hugging Face": on a Space (as gradio tells one: SYSTEM=spaces, else it
    mocks the sign-in with the machine's own login) whose README asks for OAuth (`hf_oauth: true` makes the Space set
    OAUTH_CLIENT_ID); gradio's sign-in cannot start without it."""
    return on_space() and os.environ.get("SYSTEM") == "spaces" and bool(os.environ.get("OAUTH_CLIENT_ID"))


def visitor_token(oauth_token: gr.OAuthToken | None, space: bool) -> str | bool | None:
    """The token argument for a visitor's Hub request: their own OAuth token when they signed in; on a Space without
    a sign-in, ANONYMOUS; locally, None (the machine's login)."""
    if oauth_token is not None and oauth_token.token:
        return oauth_token.token
    return ANONYMOUS if space else None
