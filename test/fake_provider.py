#!/usr/bin/env python3
"""A fake payment provider for the HTTP step tests (docs/http.md). Stdlib only.

    fake_provider.py PORTFILE [--close]

Listens on 127.0.0.1 on a free port and writes that port to PORTFILE once it is listening.
With --close every response closes its connection (no keep-alive): the tests of faults use it
so that libcurl never repeats a request on a reused connection by itself.

Every request to /charge/TAG (any method) may charge TAG. A request with an Idempotency-Key
header (or the header named by ?key_header=NAME) that was answered before gets the stored
response again and charges nothing: one charge per key. Faults, by query parameter `fault`:

    delay&secs=N   charge, then wait N seconds before answering (past the client's timeout)
    drop           charge, then close the connection without answering
    500 / 503      answer 500 / 503 without charging, `times` times (default 1) for this tag
    429s           answer 429 with Retry-After: 1 (seconds; &secs=N: N) once for this tag, then
                   charge
    429x&secs=N    answer 429 with X-RateLimit-Reset: N (and no Retry-After) once for this tag,
                   then charge
    429d           answer 429 with Retry-After as an HTTP-date 3 s ahead once, then charge
    400            answer 400 {"error": "bad request"}, never charge
    status&code=N  answer N {"error": "status N"} without charging, `times` times (default 1)
                   for this tag, then charge
    badjson        charge, then answer 200 with a body that is not JSON
    big&size=N     charge, then answer 200 with N bytes of JSON

A fault that charges strikes only the first request of its key (or of its tag without a key);
later requests are answered normally (or from the stored response).

Every request to /mail/TAG (TAG percent-decoded: a mail sink for tasks' receipts) delivers a
message to TAG. A request with an Idempotency-Key header that was answered before gets the
stored answer again, with Idempotent-Replayed: true, and delivers nothing: one delivery per key.
A delivery answers 200 {"delivered": TAG, "message_id": ID, "message": n}. Its faults, by query
parameter `fault`, strike only the first request of its key (or of its tag without a key):

    delay&secs=N   deliver (and store the answer), then wait N seconds before answering
    503            answer 503 without delivering

GET /counts answers {"charges": {TAG: n}, "requests": {TAG: n}, "keys": {TAG: [keys seen]},
"connections": n, "auth": {TAG: [Authorization values seen]},
"header_names": {TAG: [[header names of each request, lower case]]},
"mail": {TAG: deliveries}, "mail_requests": {TAG: n}, "mail_keys": {TAG: [keys seen]},
"mail_messages": {TAG: [the body of each delivery, parsed when JSON]}}.
"""
import email.utils
import json
import os
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LOCK = threading.Lock()
CHARGES = {}
REQUESTS = {}
KEYS = {}
AUTH = {}
HEADER_NAMES = {}
STORED = {}     # idempotency key -> (status, headers, body)
STRUCK = set()  # keys/tags a one-time fault has struck
FAILS = {}      # tag -> failures answered so far
CONNECTIONS = [0]
MAIL = {}           # tag -> deliveries
MAIL_REQUESTS = {}
MAIL_KEYS = {}
MAIL_MESSAGES = {}
MAIL_STORED = {}    # idempotency key -> the answer of its delivery
MAIL_STRUCK = set()
CLOSE = '--close' in sys.argv


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.0' if CLOSE else 'HTTP/1.1'

    def setup(self):
        super().setup()
        with LOCK:
            CONNECTIONS[0] += 1

    def log_message(self, fmt, *args):
        pass

    def answer(self, status, body, headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if CLOSE:
            self.send_header('Connection', 'close')
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(data)
        return True

    def handle_any(self):
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get('Content-Length') or 0)
        payload = self.rfile.read(length) if length else b''
        if url.path == '/counts':
            with LOCK:
                return self.answer(200, {'charges': CHARGES, 'requests': REQUESTS, 'keys': KEYS,
                                         'connections': CONNECTIONS[0], 'auth': AUTH,
                                         'header_names': HEADER_NAMES, 'mail': MAIL,
                                         'mail_requests': MAIL_REQUESTS, 'mail_keys': MAIL_KEYS,
                                         'mail_messages': MAIL_MESSAGES})
        if url.path.startswith('/mail/'):
            return self.mail(unquote(url.path[len('/mail/'):]), q, payload)
        if not url.path.startswith('/charge/'):
            return self.answer(404, {'error': 'no such path'})
        tag = url.path[len('/charge/'):]
        key = self.headers.get(q.get('key_header', 'Idempotency-Key'))
        fault = q.get('fault', '')
        once = key or tag
        with LOCK:
            REQUESTS[tag] = REQUESTS.get(tag, 0) + 1
            KEYS.setdefault(tag, []).append(key)
            AUTH.setdefault(tag, []).append(self.headers.get('Authorization'))
            HEADER_NAMES.setdefault(tag, []).append(sorted(k.lower() for k in self.headers.keys()))
            if key is not None and key in STORED:
                status, headers, body = STORED[key]
                replay = True
            else:
                replay = False
        if replay:
            return self.answer(status, body, dict(headers, **{'Idempotent-Replayed': 'true'}))

        # faults that answer before charging
        with LOCK:
            if fault in ('500', '503') and FAILS.get(tag, 0) < int(q.get('times', '1')):
                FAILS[tag] = FAILS.get(tag, 0) + 1
                failing = int(fault)
            elif fault in ('429s', '429d', '429x') and tag not in STRUCK:
                STRUCK.add(tag)
                failing = 429
            elif fault == '400':
                failing = 400
            elif fault == 'status' and FAILS.get(tag, 0) < int(q.get('times', '1')):
                FAILS[tag] = FAILS.get(tag, 0) + 1
                failing = int(q.get('code', '500'))
            else:
                failing = None
        if failing == 429 and fault == '429x':
            return self.answer(429, {'error': 'slow down'}, {'X-RateLimit-Reset': q.get('secs', '1')})
        if failing == 429:
            after = q.get('secs', '1') if fault == '429s' else email.utils.formatdate(time.time() + 3, usegmt=True)
            return self.answer(429, {'error': 'slow down'}, {'Retry-After': after})
        if failing is not None:
            return self.answer(failing, {'error': 'bad request' if failing == 400 else
                                         'status %d' % failing if fault == 'status' else 'unavailable'})

        # the charge
        with LOCK:
            CHARGES[tag] = CHARGES.get(tag, 0) + 1
            n = CHARGES[tag]
            strike = fault in ('delay', 'drop') and once not in STRUCK
            if strike:
                STRUCK.add(once)
        body = {'charged': tag, 'charge': n, 'method': self.command,
                'received': payload.decode('utf-8', 'replace')}
        status, headers = 200, {}
        if fault == 'badjson':
            body = b'{"charged": not json'
        elif fault == 'big':
            body = json.dumps({'pad': 'x' * int(q.get('size', '2000000'))}).encode()
        if key is not None:
            with LOCK:
                STORED[key] = (status, headers, body)
        if strike and fault == 'delay':
            time.sleep(float(q.get('secs', '3')))
        elif strike and fault == 'drop':
            self.close_connection = True
            self.connection.shutdown(2)
            return True
        try:
            return self.answer(status, body, headers)
        except (BrokenPipeError, ConnectionResetError):
            return True

    def mail(self, tag, q, payload):
        """A mail sink: one delivery per idempotency key, a repeat answered from its record."""
        key = self.headers.get('Idempotency-Key')
        fault = q.get('fault', '')
        text = payload.decode('utf-8', 'replace')
        try:
            message = json.loads(text)
        except ValueError:
            message = text
        with LOCK:
            MAIL_REQUESTS[tag] = MAIL_REQUESTS.get(tag, 0) + 1
            MAIL_KEYS.setdefault(tag, []).append(key)
            stored = MAIL_STORED.get(key) if key is not None else None
            strike = stored is None and fault in ('delay', '503') and (key or tag) not in MAIL_STRUCK
            if strike:
                MAIL_STRUCK.add(key or tag)
            if stored is None and not (strike and fault == '503'):
                # the delivery, and its answer stored under its key in the same breath: a
                # repeat that comes while this one is delayed is answered from the record
                MAIL[tag] = MAIL.get(tag, 0) + 1
                MAIL_MESSAGES.setdefault(tag, []).append(message)
                body = {'delivered': tag, 'message_id': 'msg-%d' % sum(MAIL.values()),
                        'message': MAIL[tag]}
                if key is not None:
                    MAIL_STORED[key] = body
        if stored is not None:
            return self.answer(200, stored, {'Idempotent-Replayed': 'true'})
        if strike and fault == '503':
            return self.answer(503, {'error': 'unavailable'})
        if strike and fault == 'delay':
            time.sleep(float(q.get('secs', '3')))
        try:
            return self.answer(200, body)
        except (BrokenPipeError, ConnectionResetError):
            return True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # many requests connect at once: the default backlog of 5 would delay connections by 1 s
    request_queue_size = 256


def exit_with_parent():
    """The test that started us may end any way it likes: never outlive it."""
    parent = os.getppid()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def main():
    threading.Thread(target=exit_with_parent, daemon=True).start()
    server = Server(('127.0.0.1', 0), Handler)
    with open(sys.argv[1] + '.tmp', 'w') as f:
        f.write(str(server.server_address[1]))
    os.rename(sys.argv[1] + '.tmp', sys.argv[1])
    server.serve_forever()


if __name__ == '__main__':
    main()
