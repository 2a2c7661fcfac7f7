/* K layers of linear self-attention in the Gram form (kernels.py), forward and loss gradient, in C
   (tdyn.native builds it with T, D, K and REAL defined; docs/reproductions/icl-gd.md#speed).

   The batch is last: tokens E[s][t][j][b], b contiguous, so one vector holds one entry of LN sequences and every
   per-sequence product is LN-wide vector arithmetic on a chunk that stays in L1. Per chunk and layer l < K-1
   (every token moves):  C = X^T X over the N context rows, R = E G_l^T, Q = R C, E <- E + Q A_l^T;
   the last layer reads the query's y entry only:  yhat = -(q_y + a . C G_K q), a = A_K's row y.
   lsa_loss runs the backward in the same pass (reverse mode of the above, kernels.py's _bwd with every product
   dense) and returns the gradient of (1/n) sum_b (yhat_b - y_b)^2 / 2 with the loss: no activations leave L1.
   Sums run in a fixed order (no fused multiply-add: tdyn.native's flags), so the results are the same bits
   whatever vector width the compiler picks. */
#include <stdlib.h>
#include <string.h>

#define VB 64
#define LN ((int)(VB / sizeof(REAL)))
#define N (T - 1)
#define TD (T * D)
#define DD (D * D)
typedef REAL vr __attribute__((vector_size(VB)));
typedef REAL vu __attribute__((vector_size(VB), aligned(sizeof(REAL))));  /* for tensors' memory: any alignment */

/* one chunk's forward from E + b0; keeps the tokens entering each layer (Es), the full layers' C, R, Q, and the
   last layer's C, u = G_K q and C u */
static void chunk_fwd(const REAL *E, long n, long b0, const REAL *A, const REAL *G,
                      vr *Es, vr *Cs, vr *Rs, vr *Qs, vr *Cl, vr *u, vr *Cu, vr *yh) {
  for (int i = 0; i < TD; i++) Es[i] = *(const vu *)(E + (long)i * n + b0);
  for (int l = 0; l < K - 1; l++) {
    vr *X = Es + l * TD, *Xn = Es + (l + 1) * TD, *C = Cs + l * DD, *R = Rs + l * TD, *Q = Qs + l * TD;
    const REAL *Gl = G + l * DD, *Al = A + l * DD;
    for (int i = 0; i < D; i++) for (int j = 0; j <= i; j++) {          /* C = sum_i e_i e_i^T (context) */
      vr acc = X[i] * X[j];
      for (int t = 1; t < N; t++) acc += X[t * D + i] * X[t * D + j];
      C[i * D + j] = acc; C[j * D + i] = acc;
    }
    for (int t = 0; t < T; t++) for (int k = 0; k < D; k++) {            /* R = E G^T: rows (G e_t)^T */
      vr acc = Gl[k * D] * X[t * D];
      for (int j = 1; j < D; j++) acc += Gl[k * D + j] * X[t * D + j];
      R[t * D + k] = acc;
    }
    for (int t = 0; t < T; t++) for (int k = 0; k < D; k++) {            /* Q = R C: rows (C G e_t)^T */
      vr acc = R[t * D] * C[k];
      for (int j = 1; j < D; j++) acc += R[t * D + j] * C[j * D + k];
      Q[t * D + k] = acc;
    }
    for (int t = 0; t < T; t++) for (int k = 0; k < D; k++) {            /* e_t <- e_t + A C G e_t */
      vr acc = X[t * D + k];
      for (int j = 0; j < D; j++) acc += Q[t * D + j] * Al[k * D + j];
      Xn[t * D + k] = acc;
    }
  }
  vr *X = Es + (K - 1) * TD, *q = X + N * D;
  const REAL *Gl = G + (K - 1) * DD, *a = A + (K - 1) * DD + (D - 1) * D;
  for (int i = 0; i < D; i++) for (int j = 0; j <= i; j++) {
    vr acc = X[i] * X[j];
    for (int t = 1; t < N; t++) acc += X[t * D + i] * X[t * D + j];
    Cl[i * D + j] = acc; Cl[j * D + i] = acc;
  }
  for (int k = 0; k < D; k++) {
    vr acc = Gl[k * D] * q[0];
    for (int j = 1; j < D; j++) acc += Gl[k * D + j] * q[j];
    u[k] = acc;
  }
  vr y = q[D - 1];
  for (int i = 0; i < D; i++) {
    vr acc = Cl[i * D] * u[0];
    for (int k = 1; k < D; k++) acc += Cl[i * D + k] * u[k];
    Cu[i] = acc;
    y += a[i] * acc;
  }
  *yh = -y;
}

/* yhat[s][b] for S members; E (S, T, D, n), A and G (S, K, D, D); n a multiple of LN */
/* the chunk's buffers, on the heap (a thread's stack may be small): K*(3*TD + DD) + DD + 2*D vectors */
static vr *buffers(void) {
  return aligned_alloc(VB, sizeof(vr) * (K * (3 * TD + DD) + DD + 2 * D));
}

/* returns 0, or 1 where the buffers could not be allocated (nothing computed) */
int lsa_forward(const REAL *E, long S, long n, const REAL *A, const REAL *G, REAL *yhat) {
  vr *buf = buffers(), yh;
  if (!buf) return 1;
  vr *Es = buf, *Rs = Es + K * TD, *Qs = Rs + K * TD, *Cs = Qs + K * TD, *Cl = Cs + K * DD, *u = Cl + DD, *Cu = u + D;
  for (long s = 0; s < S; s++)
    for (long b0 = 0; b0 < n; b0 += LN) {
      chunk_fwd(E + s * TD * n, n, b0, A + s * K * DD, G + s * K * DD, Es, Cs, Rs, Qs, Cl, u, Cu, &yh);
      *(vu *)(yhat + s * n + b0) = yh;
    }
  free(buf);
  return 0;
}

/* loss[s] = (1/m) sum_b (yhat - y)^2 / 2 over the first m of n sequences (the rest padding: zero tokens and
   targets, which add nothing), and its gradient dA, dG (S, K, D, D), overwritten */
int lsa_loss(const REAL *E, const REAL *y, long S, long n, long m, const REAL *A, const REAL *G,
             REAL *loss, REAL *dA, REAL *dG) {
  vr *buf = buffers(), yh;
  vr *grads = aligned_alloc(VB, sizeof(vr) * (2 * K * DD + 3 * TD + DD + D));
  if (!buf || !grads) { free(buf); free(grads); return 1; }
  vr *Es = buf, *Rs = Es + K * TD, *Qs = Rs + K * TD, *Cs = Qs + K * TD, *Cl = Cs + K * DD, *u = Cl + DD, *Cu = u + D;
  vr *gA = grads, *gG = gA + K * DD, *dE = gG + K * DD, *dQ = dE + TD, *dR = dQ + TD, *Sy = dR + TD, *Ca = Sy + DD;
  const REAL inv = (REAL)1 / (REAL)m;
  for (long s = 0; s < S; s++) {
    const REAL *Es0 = E + s * TD * n, *As = A + s * K * DD, *Gs = G + s * K * DD;
    vr lacc = {0};
    memset(gA, 0, sizeof(vr) * K * DD);
    memset(gG, 0, sizeof(vr) * K * DD);
    for (long b0 = 0; b0 < n; b0 += LN) {
      chunk_fwd(Es0, n, b0, As, Gs, Es, Cs, Rs, Qs, Cl, u, Cu, &yh);
      vr r = yh - *(const vu *)(y + s * n + b0);
      lacc += r * r;
      vr g = -(r * inv);                                    /* -dL/dyhat */
      vr *X = Es + (K - 1) * TD, *q = X + N * D;
      const REAL *Gl = Gs + (K - 1) * DD, *a = As + (K - 1) * DD + (D - 1) * D;
      for (int i = 0; i < D; i++) {                         /* C a */
        vr acc = Cl[i * D] * a[0];
        for (int k = 1; k < D; k++) acc += Cl[i * D + k] * a[k];
        Ca[i] = acc;
      }
      vr *gAl = gA + (K - 1) * DD, *gGl = gG + (K - 1) * DD;
      for (int i = 0; i < D; i++) gAl[(D - 1) * D + i] += g * Cu[i];          /* d a = g C u */
      for (int k = 0; k < D; k++) {                                           /* d G_K = g (C a) q^T */
        vr gc = g * Ca[k];
        for (int j = 0; j < D; j++) gGl[k * D + j] += gc * q[j];
      }
      if (K == 1) continue;
      for (int j = 0; j < D; j++) {                         /* d q = g (e_y + G^T C a) */
        vr acc = Gl[j] * Ca[0];
        for (int k = 1; k < D; k++) acc += Gl[k * D + j] * Ca[k];
        dE[N * D + j] = g * acc;
      }
      dE[N * D + D - 1] += g;
      for (int t = 0; t < N; t++) {                         /* d x_t = g ((x_t.a) u + (x_t.u) a): C's gradient */
        vr xa = X[t * D] * a[0], xu = X[t * D] * u[0];
        for (int j = 1; j < D; j++) { xa += X[t * D + j] * a[j]; xu += X[t * D + j] * u[j]; }
        xa *= g; xu *= g;
        for (int j = 0; j < D; j++) dE[t * D + j] = xa * u[j] + xu * a[j];
      }
      for (int l = K - 2; l >= 0; l--) {                    /* the full layers, last first */
        vr *El = Es + l * TD, *C = Cs + l * DD, *R = Rs + l * TD, *Q = Qs + l * TD;
        const REAL *Al = As + l * DD, *Glr = Gs + l * DD;
        vr *gAr = gA + l * DD, *gGr = gG + l * DD;
        for (int k = 0; k < D; k++) for (int j = 0; j < D; j++) {            /* d A += dE^T Q */
          vr acc = dE[k] * Q[j];
          for (int t = 1; t < T; t++) acc += dE[t * D + k] * Q[t * D + j];
          gAr[k * D + j] += acc;
        }
        for (int t = 0; t < T; t++) for (int j = 0; j < D; j++) {            /* dQ = dE A */
          vr acc = dE[t * D] * Al[j];
          for (int k = 1; k < D; k++) acc += dE[t * D + k] * Al[k * D + j];
          dQ[t * D + j] = acc;
        }
        for (int t = 0; t < T; t++) for (int j = 0; j < D; j++) {            /* dR = dQ C */
          vr acc = dQ[t * D] * C[j];
          for (int k = 1; k < D; k++) acc += dQ[t * D + k] * C[k * D + j];
          dR[t * D + j] = acc;
        }
        for (int k = 0; k < D; k++) for (int j = 0; j < D; j++) {            /* d G += dR^T E */
          vr acc = dR[k] * El[j];
          for (int t = 1; t < T; t++) acc += dR[t * D + k] * El[t * D + j];
          gGr[k * D + j] += acc;
        }
        if (l == 0) break;                                  /* the data's tokens need no gradient */
        for (int i = 0; i < D; i++) for (int j = 0; j <= i; j++) {           /* dC + dC^T, dC = R^T dQ */
          vr acc = R[i] * dQ[j] + R[j] * dQ[i];
          for (int t = 1; t < T; t++) acc += R[t * D + i] * dQ[t * D + j] + R[t * D + j] * dQ[t * D + i];
          Sy[i * D + j] = acc; Sy[j * D + i] = acc;
        }
        for (int t = 0; t < T; t++) for (int j = 0; j < D; j++) {            /* dE <- dE + dR G + [ctx] E (dC + dC^T) */
          vr acc = dE[t * D + j];
          for (int k = 0; k < D; k++) acc += dR[t * D + k] * Glr[k * D + j];
          if (t < N) for (int i = 0; i < D; i++) acc += El[t * D + i] * Sy[i * D + j];
          dE[t * D + j] = acc;
        }
      }
    }
    REAL tot = 0;
    for (int l = 0; l < LN; l++) tot += lacc[l];
    loss[s] = (REAL)0.5 * tot * inv;
    for (int i = 0; i < K * DD; i++) {
      REAL a = 0, g = 0;
      for (int l = 0; l < LN; l++) { a += gA[i][l]; g += gG[i][l]; }
      dA[s * K * DD + i] = a;
      dG[s * K * DD + i] = g;
    }
  }
  free(buf);
  free(grads);
  return 0;
}
